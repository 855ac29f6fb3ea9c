//! Signed precompiled policies without the Wasm runtime: what a compiled policy is made for
//! ([`target`]), its signed form ([`artifact`], [`signing`]), and the compiling child process
//! ([`child`], which can [`give_way`] to the control plane). The policy host builds on these;
//! the operator, which must not link the runtime, compiles for its nodes with them (the compile
//! itself runs in the child).

pub mod artifact;
pub mod child;
pub mod give_way;
pub mod signing;
pub mod target;
