use std::cell::OnceCell;
use std::marker::PhantomData;

use crate::__private::splitter::exports::perennial::policy::splitter as wit;

/// Where a sample goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Assignment {
    Train = 0,
    Eval = 1,
    Skip = 2,
}

/// A batch of new samples, in dataset order.
///
/// The lines are fetched from the host the first time one is read, in one call; a rule that
/// only counts samples never pays for them.
pub struct Batch {
    first_seq: u64,
    count: usize,
    lines: OnceCell<Packed>,
}

struct Packed {
    data: Vec<u8>,
    ends: Vec<u32>,
}

impl Batch {
    /// A batch made of `lines`, for native tests of a splitter.
    pub fn from_lines<S: AsRef<str>>(first_seq: u64, lines: &[S]) -> Batch {
        let mut data = Vec::new();
        let mut ends = Vec::with_capacity(lines.len());
        for line in lines {
            data.extend_from_slice(line.as_ref().as_bytes());
            ends.push(u32::try_from(data.len()).expect("a test batch under 4 GiB"));
        }
        Batch { first_seq, count: lines.len(), lines: OnceCell::from(Packed { data, ends }) }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Sequence number (0-based position in the dataset) of the first sample.
    pub fn first_seq(&self) -> u64 {
        self.first_seq
    }

    /// Sequence number of sample `index` of this batch.
    pub fn seq(&self, index: usize) -> u64 {
        self.first_seq + index as u64
    }

    /// The raw bytes of sample `index` (without its line end). Panics if out of range.
    pub fn bytes(&self, index: usize) -> &[u8] {
        let packed = self.packed();
        let start = if index == 0 { 0 } else { packed.ends[index - 1] as usize };
        &packed.data[start..packed.ends[index] as usize]
    }

    /// Sample `index` as text. Panics if out of range.
    pub fn line(&self, index: usize) -> &str {
        std::str::from_utf8(self.bytes(index)).expect("the host sends samples as UTF-8")
    }

    /// All samples as text, in order.
    pub fn lines(&self) -> impl Iterator<Item = &str> {
        (0..self.count).map(|index| self.line(index))
    }

    fn packed(&self) -> &Packed {
        self.lines.get_or_init(|| {
            let packed = fetch_lines();
            assert_eq!(packed.ends.len(), self.count, "the host sent a different number of lines than the batch holds");
            packed
        })
    }
}

#[cfg(target_arch = "wasm32")]
fn fetch_lines() -> Packed {
    let lines = crate::__private::splitter::perennial::policy::batch_data::lines();
    Packed { data: lines.data, ends: lines.ends }
}

#[cfg(not(target_arch = "wasm32"))]
fn fetch_lines() -> Packed {
    unreachable!("a native Batch is built with Batch::from_lines")
}

/// Splits new samples between training and evaluation.
pub trait Splitter: Sized + 'static {
    /// Builds the policy from the job's JSON config, or says what is wrong with it,
    /// naming the field.
    fn configure(config: &str) -> Result<Self, String>;

    /// One assignment per sample of `batch`, in order.
    fn split(&mut self, batch: &Batch) -> Vec<Assignment>;
}

#[doc(hidden)]
pub struct Export<T>(PhantomData<T>);

impl<T: Splitter> wit::Guest for Export<T> {
    fn configure(config: String) -> Result<(), String> {
        crate::state::set(T::configure(&config)?);
        Ok(())
    }

    fn split(batch: wit::Batch) -> Vec<u8> {
        let batch = Batch { first_seq: batch.first_seq, count: batch.count as usize, lines: OnceCell::new() };
        let assignments = crate::state::with(|policy: &mut T| policy.split(&batch));
        assignments.into_iter().map(|a| a as u8).collect()
    }
}
