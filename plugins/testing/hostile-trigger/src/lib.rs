//! A trigger that misbehaves on request, to test the host's sandbox and limits.
//! Config: `{"behaviour": "...", "address": "127.0.0.1:PORT", "onlyWhen": N, "configureMs": M}`;
//! see `Behaviour`. With `onlyWhen`, `decide` misbehaves only when `pendingTrain` is N and
//! answers normally otherwise. With `configureMs`, `configure` first spins for M milliseconds
//! (a slow start).

use perennial_guest::{Decision, Stats, Trigger};
use serde::Deserialize;

#[derive(Deserialize, Clone, Copy, PartialEq)]
#[serde(rename_all = "kebab-case")]
enum Behaviour {
    /// Trains when there is at least one pending sample.
    Ok,
    /// Spins forever in `decide`.
    Loop,
    /// Spins forever in `configure`.
    LoopInConfigure,
    /// Allocates until it runs out of memory.
    Alloc,
    /// Panics.
    Panic,
    /// Tries to read /etc/hostname and reports what happened.
    ReadFile,
    /// Tries to connect to `address` and reports what happened.
    Connect,
    /// Counts the environment variables it can see.
    Env,
    /// Logs far more lines than the host keeps.
    LogFlood,
    /// Prints to stdout and stderr.
    Print,
    /// Sleeps for an hour (waits on the host, out of reach of the epoch deadline).
    Sleep,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Config {
    behaviour: Behaviour,
    #[serde(default)]
    address: String,
    only_when: Option<u64>,
    configure_ms: Option<u64>,
}

pub struct Hostile {
    behaviour: Behaviour,
    address: String,
    only_when: Option<u64>,
}

impl Trigger for Hostile {
    fn configure(config: &str) -> Result<Self, String> {
        let config: Config = perennial_guest::parse_config(config)?;
        if let Some(ms) = config.configure_ms {
            let started = std::time::Instant::now();
            while started.elapsed() < std::time::Duration::from_millis(ms) {
                std::hint::black_box(());
            }
        }
        if config.behaviour == Behaviour::LoopInConfigure {
            spin();
        }
        Ok(Hostile { behaviour: config.behaviour, address: config.address, only_when: config.only_when })
    }

    fn decide(&mut self, stats: &Stats) -> Decision {
        let behaviour = match self.only_when {
            Some(n) if n != stats.pending_train => Behaviour::Ok,
            _ => self.behaviour,
        };
        match behaviour {
            Behaviour::Ok | Behaviour::LoopInConfigure => {
                Decision { train: stats.pending_train > 0, reason: "ok".into(), recheck_after_secs: None }
            }
            Behaviour::Loop => spin(),
            Behaviour::Alloc => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    std::hint::black_box(&hoard);
                }
            }
            Behaviour::Panic => panic!("hostile plugin panics on purpose"),
            Behaviour::ReadFile => match std::fs::read_to_string("/etc/hostname") {
                Ok(text) => Decision::train(format!("read-file succeeded: {}", text.trim())),
                Err(err) => Decision::wait(format!("read-file denied: {err}")),
            },
            Behaviour::Connect => match std::net::TcpStream::connect(self.address.as_str()) {
                Ok(_) => Decision::train("connect succeeded"),
                Err(err) => Decision::wait(format!("connect denied: {err}")),
            },
            Behaviour::Env => {
                let count = std::env::vars_os().count();
                Decision {
                    train: count > 0,
                    reason: format!("{count} environment variables"),
                    recheck_after_secs: None,
                }
            }
            Behaviour::LogFlood => {
                for i in 0..100_000 {
                    perennial_guest::log::info(format!("line {i}"));
                }
                Decision::wait("flooded")
            }
            Behaviour::Sleep => {
                std::thread::sleep(std::time::Duration::from_secs(3600));
                Decision::wait("slept")
            }
            Behaviour::Print => {
                println!("hello from stdout");
                eprintln!("hello from stderr");
                Decision::wait("printed")
            }
        }
    }
}

fn spin() -> ! {
    let mut x: u64 = 0;
    loop {
        x = std::hint::black_box(x.wrapping_add(1));
    }
}

perennial_guest::export_trigger!(Hostile);
