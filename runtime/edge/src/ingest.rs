//! Ingest: new complete lines of a job's dataset index go through the job's splitter, one batch
//! at a time, and each batch's assignments are committed with the new cursor in one SQLite
//! transaction. A restart resumes from the committed cursor: no sample is split twice or
//! skipped.
//!
//! Shrunk or replaced index (one rule): when the file is shorter than what was consumed, or is
//! another file at the same path, the job forgets the batches read from the old file (their
//! byte ranges no longer hold those lines), reads the new file from its beginning, and says so.
//! Sequence numbers go on counting, so no two samples share one. Unless it is the same data: a
//! file at least as long as what was consumed that holds the last batch read byte for byte where
//! it was read (a state dir moved or copied, a file rewritten with the same lines first) is read
//! on from the cursor; a file cut short that still begins with the first batch read is read on
//! from its new end (the batches cut off are forgotten): either way no sample is counted twice.
//!
//! The store is locked to read the cursor and to commit a batch, not while the file is read or
//! the splitter decides; a batch commits only if the job's cursor is still the one it was read
//! from (the job replaced meanwhile: nothing of the batch is committed, and reading goes on from
//! the new job's cursor).

use std::sync::Mutex;

use rusqlite::{OptionalExtension, params};

use super::index_file::{FileStat, IndexFile};
use super::lines::{self, Cursor};
use crate::decisions::{BatchInput, DecidedBy, DecisionKind, Record, SplitCounts};
use crate::sqlite::{Store, lock};
use perennial_policy::{Assignments, OnError, PolicyError, SampleBatch, SplitterPolicy};

/// Bounds on what is held in memory at once.
#[derive(Clone, Copy, Debug)]
pub struct IngestLimits {
    /// Longest line accepted, in bytes (default 1 MiB).
    pub max_line: usize,
    /// Bytes read and split per batch (default 4 MiB).
    pub batch_bytes: usize,
    /// Batches committed per call before returning (default: all there are), so that the caller
    /// can ask the trigger after each one.
    pub batches_per_call: u32,
}

impl Default for IngestLimits {
    fn default() -> Self {
        IngestLimits { max_line: 1 << 20, batch_bytes: 4 << 20, batches_per_call: u32::MAX }
    }
}

/// What the file looked like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileState {
    /// The index does not exist yet: the job waits for it.
    Missing,
    Present,
}

/// What one ingest pass did.
#[derive(Debug, PartialEq)]
pub struct Ingested {
    pub state: FileState,
    /// New samples committed.
    pub samples: u64,
    pub batches: u32,
    /// Lines refused, each naming the file and line.
    pub refused: Vec<String>,
    /// Set when the index shrank or was replaced and reading started over.
    pub restarted: Option<String>,
    /// Set when the splitter failed and the built-in rule decided instead.
    pub fell_back: Option<PolicyError>,
}

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("reading {file}: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("job {0} is not known to the edge store")]
    UnknownJob(String),
    #[error("the job's splitter failed and its onError is hold: {0}")]
    Held(PolicyError),
    #[error(transparent)]
    Store(#[from] rusqlite::Error),
}

/// How a job splits: its policy (`None`: Sedna's rule computed natively), and the `trainProb`
/// of that rule, which is also the fallback when the policy fails.
pub struct Split<'a> {
    pub policy: Option<&'a SplitterPolicy>,
    pub train_prob: f64,
    /// The job's shadow splitter, asked each batch after it is committed.
    pub shadow: crate::rounds::Shadow<'a>,
}

/// The job's committed reading position in its index.
struct JobFile {
    cursor: Cursor,
    file_id: Option<String>,
    batches: i64,
    /// The last round started.
    round: i64,
}

impl JobFile {
    /// Whether both read the file at the same place (the job was not replaced in between).
    fn same_place(&self, other: &JobFile) -> bool {
        (self.cursor, &self.file_id, self.batches) == (other.cursor, &other.file_id, other.batches)
    }
}

fn load(store: &Store, job: &str) -> Result<JobFile, IngestError> {
    store
        .conn()
        .prepare_cached(
            "SELECT cursor_offset, cursor_lines, cursor_samples, cursor_skipping, file_id, batches, round
             FROM jobs WHERE name = ?1",
        )?
        .query_row([job], |row| {
            Ok(JobFile {
                cursor: Cursor {
                    offset: row.get::<_, i64>(0)? as u64,
                    lines: row.get::<_, i64>(1)? as u64,
                    samples: row.get::<_, i64>(2)? as u64,
                    skipping_from: row.get::<_, Option<i64>>(3)?.map(|v| v as u64),
                },
                file_id: row.get(4)?,
                batches: row.get(5)?,
                round: row.get(6)?,
            })
        })
        .optional()?
        .ok_or_else(|| IngestError::UnknownJob(job.to_owned()))
}

/// Reads and commits everything new in the job's index.
pub fn ingest(
    store: &Mutex<Store>,
    job: &str,
    file: &mut dyn IndexFile,
    csv: bool,
    split: &Split<'_>,
    limits: IngestLimits,
) -> Result<Ingested, IngestError> {
    let name = file.name();
    let read_error = |source| IngestError::Read { file: name.clone(), source };
    let mut out = Ingested {
        state: FileState::Present,
        samples: 0,
        batches: 0,
        refused: Vec::new(),
        restarted: None,
        fell_back: None,
    };
    let mut state = load(&lock(store), job)?;
    loop {
        let Some(stat) = file.stat().map_err(read_error)? else {
            out.state = FileState::Missing;
            return Ok(out);
        };
        if let Some(reason) = replaced(&state, &stat) {
            if stat.len >= state.cursor.offset && holds_batch(store, job, file, Which::Last)? {
                // The same data under another identity: the state dir moved or copied, or the
                // file rewritten with the same lines first. Re-reading it would count each
                // sample twice.
                lock(store).conn().execute("UPDATE jobs SET file_id = ?2 WHERE name = ?1", params![job, stat.id])?;
                state.file_id = Some(stat.id.clone());
                out.restarted = Some(format!(
                    "{name}: {reason}, but it holds the samples already read where they were read: reading on \
                     from byte {}",
                    state.cursor.offset
                ));
            } else if stat.len < state.cursor.offset && holds_batch(store, job, file, Which::First)? {
                // Cut short, its beginning as it was read: what is left was read already.
                cut(&mut lock(store), job, &stat)?;
                out.restarted = Some(format!(
                    "{name}: {reason}, but it begins with the samples already read: reading on from byte {} \
                     (the samples cut off are forgotten)",
                    stat.len
                ));
                state = load(&lock(store), job)?;
            } else {
                let mut locked = lock(store);
                restart(&mut locked, job, &stat)?;
                out.restarted = Some(format!("{name}: {reason}; reading it again from the start"));
                state = load(&locked, job)?;
            }
        } else if state.file_id.is_none() {
            lock(store).conn().execute("UPDATE jobs SET file_id = ?2 WHERE name = ?1", params![job, stat.id])?;
            state.file_id = Some(stat.id.clone());
        }
        if state.cursor.offset >= stat.len {
            return Ok(out);
        }
        let want = (stat.len - state.cursor.offset).min(limits.batch_bytes.max(limits.max_line + 2) as u64);
        let buf = file.read_at_checked(state.cursor.offset, want as usize, &stat).map_err(read_error)?;
        let scan = lines::scan(&buf, state.cursor, limits.max_line, csv);
        if scan.cursor == state.cursor {
            return Ok(out); // only a partial line so far
        }
        out.refused.extend(scan.refused.iter().map(|refused| format!("{name}: {refused}")));
        let n = scan.samples.len();
        let packed = || {
            let mut batch = SampleBatch::with_capacity(scan.samples.first().map_or(0, |l| l.seq), n, buf.len());
            for line in &scan.samples {
                batch.push(line.text).expect("a batch is at most batch_bytes long");
            }
            batch
        };
        // The shadow's copy, made only when there is a shadow.
        let for_shadow = split.shadow.filter(|_| n > 0).map(|_| packed());
        let started = std::time::Instant::now();
        let mut decided_by = split.policy.map(DecidedBy::of);
        // The time recorded: a policy's call alone (not a fresh instance's start), else Sedna's rule's.
        let mut policy_micros = None;
        let assignments = match split.policy {
            _ if n == 0 => Assignments::sedna_ratio(0.0, 0, 0),
            None => Assignments::sedna_ratio(split.train_prob, scan.samples[0].seq, n),
            Some(policy) => match policy.split(packed()) {
                Ok(assignments) => {
                    policy_micros = Some(policy.last_call_micros());
                    assignments
                }
                Err(err) if policy.info().on_error == OnError::Fallback => {
                    out.fell_back = Some(err);
                    decided_by = None;
                    Assignments::sedna_ratio(split.train_prob, scan.samples[0].seq, n)
                }
                Err(err) => return Err(IngestError::Held(err)),
            },
        };
        let micros = policy_micros.unwrap_or_else(|| started.elapsed().as_micros() as u64);
        let (train, eval, skip) = assignments.counts();
        let checksum = match (scan.samples.first(), scan.samples.last()) {
            (Some(first), Some(last)) => Some(batch_checksum(
                &buf[(first.start - state.cursor.offset) as usize..(last.end - state.cursor.offset) as usize],
            )),
            _ => None,
        };
        let record = match (scan.samples.first(), scan.samples.last(), &checksum) {
            (Some(first), Some(last), Some(checksum)) => {
                let input = BatchInput {
                    batch: state.batches + 1,
                    first_seq: first.seq,
                    count: n as u64,
                    start: first.start,
                    end: last.end,
                    checksum: hex::encode(checksum),
                    train_prob: decided_by.is_none().then_some(split.train_prob),
                };
                let counts = SplitCounts { train: train as u64, eval: eval as u64, skip: skip as u64 };
                let now_ms = crate::decisions::now_ms();
                let by = decided_by.unwrap_or_else(|| DecidedBy::native_split(split.train_prob));
                Some(Record {
                    input: serde_json::to_value(&input).unwrap_or_default(),
                    answer: serde_json::to_value(counts).unwrap_or_default(),
                    micros,
                    ..Record::of(DecisionKind::Splitter, job, now_ms, by, state.round)
                })
            }
            _ => None,
        };
        let mut locked = lock(store);
        let now = load(&locked, job)?;
        if !now.same_place(&state) {
            // The job was replaced while its batch was split: nothing of it is committed, and
            // reading goes on from the new job's cursor.
            state = now;
            continue;
        }
        let tx = locked.write_recording(record.as_slice())?;
        if let (Some(first), Some(last)) = (scan.samples.first(), scan.samples.last()) {
            tx.execute(
                "INSERT INTO batches (job, batch, first_seq, start, end, assignments, train_count, eval_count, checksum)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    job,
                    state.batches + 1,
                    first.seq as i64,
                    first.start as i64,
                    last.end as i64,
                    assignments.as_bytes(),
                    train as i64,
                    eval as i64,
                    checksum
                ],
            )?;
            state.batches += 1;
            out.batches += 1;
            out.samples += scan.samples.len() as u64;
        }
        if let Some(header) = scan.header {
            tx.execute("UPDATE jobs SET header = ?2 WHERE name = ?1", params![job, header])?;
        }
        tx.execute(
            "UPDATE jobs SET cursor_offset = ?2, cursor_lines = ?3, cursor_samples = ?4, cursor_skipping = ?5,
                 file_len = ?6, refused = refused + ?7, batches = ?8 WHERE name = ?1",
            params![
                job,
                scan.cursor.offset as i64,
                scan.cursor.lines as i64,
                scan.cursor.samples as i64,
                scan.cursor.skipping_from.map(|v| v as i64),
                stat.len as i64,
                scan.refused.len() as i64,
                state.batches,
            ],
        )?;
        // The dataset's count: the furthest any of its jobs has read.
        tx.execute(
            "INSERT INTO dataset_status (dataset, samples)
             SELECT json_extract(spec, '$.dataset'), ?2 FROM jobs
             WHERE name = ?1 AND COALESCE(json_extract(spec, '$.dataset'), '') != ''
             ON CONFLICT (dataset) DO UPDATE SET samples = excluded.samples, reported = 0
             WHERE excluded.samples > dataset_status.samples",
            params![job, scan.cursor.samples as i64],
        )?;
        tx.commit()?;
        drop(locked);
        if let (Some(shadow), Some(batch)) = (split.shadow, for_shadow) {
            shadow(crate::shadow::Question::Split { batch, assignments: assignments.as_bytes().to_vec() });
        }
        state.cursor = scan.cursor;
        if out.batches >= limits.batches_per_call {
            return Ok(out);
        }
    }
}

/// The checksum of a batch's bytes, checked when round files read them back.
pub fn batch_checksum(bytes: &[u8]) -> Vec<u8> {
    xxhash_rust::xxh3::xxh3_128(bytes).to_le_bytes().to_vec()
}

/// Why the file is not the one the cursor points into, if it is not.
fn replaced(state: &JobFile, stat: &FileStat) -> Option<String> {
    match &state.file_id {
        Some(id) if *id != stat.id => Some("the index was replaced by another file".into()),
        _ if stat.len < state.cursor.offset => {
            Some(format!("the index shrank from {} to {} bytes", state.cursor.offset, stat.len))
        }
        _ => None,
    }
}

/// A batch of the job's, by age.
#[derive(Clone, Copy)]
enum Which {
    First,
    Last,
}

/// Whether `file` holds the job's first or last batch byte for byte where it was read (its
/// checksum).
fn holds_batch(store: &Mutex<Store>, job: &str, file: &mut dyn IndexFile, which: Which) -> Result<bool, IngestError> {
    let order = match which {
        Which::First => "ASC",
        Which::Last => "DESC",
    };
    let batch: Option<(i64, i64, Option<Vec<u8>>)> = lock(store)
        .conn()
        .query_row(
            &format!("SELECT start, end, checksum FROM batches WHERE job = ?1 ORDER BY batch {order} LIMIT 1"),
            [job],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    let Some((start, end, Some(checksum))) = batch else { return Ok(false) };
    let Ok(bytes) = file.read_at(start as u64, (end - start) as usize) else { return Ok(false) };
    Ok(bytes.len() == (end - start) as usize && batch_checksum(&bytes) == checksum)
}

/// A file cut short that begins as it was read: reading goes on from its end, and the batches
/// whose bytes were cut off are forgotten (their samples are gone), in one transaction.
fn cut(store: &mut Store, job: &str, stat: &FileStat) -> Result<(), rusqlite::Error> {
    let tx = store.write()?;
    tx.execute("DELETE FROM batches WHERE job = ?1 AND end > ?2", params![job, stat.len as i64])?;
    tx.execute(
        "UPDATE jobs SET cursor_offset = ?3, cursor_skipping = NULL, file_id = ?2, file_len = ?3 WHERE name = ?1",
        params![job, stat.id, stat.len as i64],
    )?;
    tx.commit()
}

/// The shrunk-or-replaced rule, in one transaction.
fn restart(store: &mut Store, job: &str, stat: &FileStat) -> Result<(), rusqlite::Error> {
    let tx = store.write()?;
    tx.execute("DELETE FROM batches WHERE job = ?1", [job])?;
    tx.execute(
        "UPDATE jobs SET cursor_offset = 0, cursor_lines = 0, cursor_skipping = NULL, header = NULL,
             file_id = ?2, file_len = ?3 WHERE name = ?1",
        params![job, stat.id, stat.len as i64],
    )?;
    tx.commit()
}
