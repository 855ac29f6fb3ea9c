//! A splitter that misbehaves on request, to test how the host checks answers. It implements
//! the raw WIT export (not the SDK's `Splitter`) so that it can send what the SDK never would.
//!
//! Config: `{"behaviour": "wrong-length" | "bad-byte" | "all-train" | "all-eval" | "all-skip"}`.

use std::cell::Cell;

use perennial_guest::__private::splitter::exports::perennial::policy::splitter::{Batch, Guest};
use serde::Deserialize;

#[derive(Deserialize, Clone, Copy)]
#[serde(rename_all = "kebab-case")]
enum Behaviour {
    /// One assignment too few.
    WrongLength,
    /// A byte that is no assignment.
    BadByte,
    AllTrain,
    AllEval,
    AllSkip,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    behaviour: Behaviour,
}

thread_local! {
    static BEHAVIOUR: Cell<Behaviour> = const { Cell::new(Behaviour::AllTrain) };
}

pub struct Hostile;

impl Guest for Hostile {
    fn configure(config: String) -> Result<(), String> {
        let config: Config = perennial_guest::parse_config(&config)?;
        BEHAVIOUR.with(|b| b.set(config.behaviour));
        Ok(())
    }

    fn split(batch: Batch) -> Vec<u8> {
        let n = batch.count as usize;
        match BEHAVIOUR.with(Cell::get) {
            Behaviour::WrongLength => vec![0; n.saturating_sub(1)],
            Behaviour::BadByte => vec![7; n],
            Behaviour::AllTrain => vec![0; n],
            Behaviour::AllEval => vec![1; n],
            Behaviour::AllSkip => vec![2; n],
        }
    }
}

#[cfg(target_arch = "wasm32")]
perennial_guest::__private::splitter::export!(Hostile with_types_in perennial_guest::__private::splitter);
