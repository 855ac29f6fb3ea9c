//! What several test binaries share (tests/support/), each using part of it.

#[path = "../../../../tests/support/link.rs"]
pub mod link;
#[path = "../../../../tests/support/s3.rs"]
pub mod s3;
