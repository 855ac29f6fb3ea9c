//! A selector that answers an index out of range, to test how the host checks answers.

use perennial_guest::{Choice, Model, Selector};

pub struct OutOfRange;

impl Selector for OutOfRange {
    fn configure(_config: &str) -> Result<Self, String> {
        Ok(OutOfRange)
    }

    fn select(&mut self, _deployed: Option<&Model>, candidates: &[Model]) -> Choice {
        Choice::deploy(candidates.len(), "an index one past the end")
    }
}

perennial_guest::export_selector!(OutOfRange);
