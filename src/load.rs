//! The load score: how busy a worker is, as one number from 0 (idle) to 100 (full),
//! the way the Keeper peer cluster this project grew from judged its nodes. Three
//! parts, each a share of what the worker is allowed:
//!
//! - **CPU**: the CPU time the worker and its robots used over the last minute,
//!   against its allowance (the cgroup's quota, else the host's cores);
//! - **executors**: the robots it runs, against its `--capacity`;
//! - **memory**: the memory it and its robots use, against the cgroup's limit,
//!   else the host's memory.
//!
//! weighed 64, 32 and 4 by default (`--load-weights`). Every worker computes its own
//! and writes it with the heartbeat it already sends; placement, the standbys' line
//! and `rebalance --by load` read it. The model here is pure: the sampler that
//! measures is `worker::load_sampler`, the queries are in `db`.

use std::fmt;
use std::str::FromStr;

/// Robots a worker runs before its executors' part is full, unless `--capacity`
/// says otherwise: what one slot of the demo and of our benches carries. A pool
/// without the flag is then ranked mostly by CPU, and by robot counts among
/// workers that use the same CPU (see docs/running.md, "Load").
pub const DEFAULT_CAPACITY: u64 = 1000;

/// Scores this close (points, 0 to 100) count as equal wherever work goes to the
/// idlest: a minute's measure of an idle worker varies by a few tenths of a point.
pub const SCORE_TIE: f64 = 1.0;

/// The weights of the score's three parts (`--load-weights CPU,EXECUTORS,MEMORY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadWeights {
    pub cpu: u32,
    pub executors: u32,
    pub memory: u32,
}

/// Keeper's: CPU 64, executors 32, memory 4.
impl Default for LoadWeights {
    fn default() -> Self {
        LoadWeights {
            cpu: 64,
            executors: 32,
            memory: 4,
        }
    }
}

impl LoadWeights {
    fn total(&self) -> f64 {
        f64::from(self.cpu) + f64::from(self.executors) + f64::from(self.memory)
    }
}

impl fmt::Display for LoadWeights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{},{}", self.cpu, self.executors, self.memory)
    }
}

impl FromStr for LoadWeights {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let usage = "takes three whole numbers, CPU,EXECUTORS,MEMORY, not all 0 (Keeper's, the default: 64,32,4)";
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        if parts.len() != 3 {
            return Err(format!("{s:?}: --load-weights {usage}"));
        }
        let mut n = [0u32; 3];
        for (slot, (part, name)) in
            n.iter_mut()
                .zip(parts.iter().zip(["CPU", "EXECUTORS", "MEMORY"]))
        {
            *slot = part.parse().map_err(|_| {
                format!(
                    "{s:?}: {name} weight {part:?} is not a whole number; --load-weights {usage}"
                )
            })?;
            if *slot > 10_000 {
                return Err(format!(
                    "{s:?}: {name} weight {part} is over 10000; --load-weights {usage}"
                ));
            }
        }
        if n == [0, 0, 0] {
            return Err(format!("{s:?}: --load-weights {usage}"));
        }
        Ok(LoadWeights {
            cpu: n[0],
            executors: n[1],
            memory: n[2],
        })
    }
}

/// A worker's load as its heartbeat carries it: the three parts as shares of its
/// allowance (0–1, a part over its allowance counts as full), what they were
/// measured against, and the score they make.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Load {
    /// CPU used over the last minute, as a share of [`Load::cores`].
    pub cpu: f64,
    /// Robots run, as a share of [`Load::capacity`].
    pub executors: f64,
    /// Memory used, as a share of [`Load::memory_bytes`].
    pub memory: f64,
    /// Robots it ran when measured.
    pub robots: u64,
    /// `--capacity`.
    pub capacity: u64,
    /// Its CPU allowance, in cores.
    pub cores: f64,
    /// Its memory allowance, in bytes.
    pub memory_bytes: u64,
    pub weights: LoadWeights,
}

/// A worker's load as the CLI, the dashboard, `/status` and `/api/v1` show it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct LoadInfo {
    /// 0 (idle) to 100 (full).
    pub score: f64,
    /// The parts, each a share of the allowance from 0 to 1.
    pub cpu: f64,
    pub executors: f64,
    pub memory: f64,
    pub robots: u64,
    pub capacity: u64,
    pub cores: f64,
    pub memory_bytes: u64,
}

impl From<&Load> for LoadInfo {
    fn from(l: &Load) -> LoadInfo {
        LoadInfo {
            score: l.score(),
            cpu: l.cpu,
            executors: l.executors,
            memory: l.memory,
            robots: l.robots,
            capacity: l.capacity,
            cores: l.cores,
            memory_bytes: l.memory_bytes,
        }
    }
}

/// A share, as a score's part counts it: 0 to 1, and 0 for nonsense.
fn share(x: f64) -> f64 {
    if x.is_finite() {
        x.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

impl Load {
    /// Measures a worker's load from what it used and what it is allowed.
    pub fn measured(used: Used, allowed: Allowed, weights: LoadWeights) -> Load {
        let capacity = allowed.capacity.max(1);
        Load {
            cpu: share(used.cores / allowed.cores),
            executors: share(used.robots as f64 / capacity as f64),
            memory: share(used.memory_bytes as f64 / allowed.memory_bytes.max(1) as f64),
            robots: used.robots,
            capacity,
            cores: allowed.cores,
            memory_bytes: allowed.memory_bytes,
            weights,
        }
    }

    /// The score, 0 (idle) to 100 (every part full), to one decimal.
    pub fn score(&self) -> f64 {
        score_of(self.cpu, self.executors, self.memory, self.weights)
    }

    /// The score this worker would have with `more` on top of what it runs, not
    /// rounded: each robot fills one executor of [`Load::capacity`], and its CPU
    /// and memory (declared or measured) fill their shares of the allowance. How
    /// placement predicts a holder's score before its next heartbeat says.
    pub fn score_with(&self, more: Cost) -> f64 {
        self.score_moved(
            more.robots as f64,
            more.millicores as f64,
            more.memory_bytes as f64,
        )
    }

    /// [`Load::score_with`] for a change either way: robots, thousandths of a core
    /// and bytes added (positive) or taken away (negative).
    pub fn score_moved(&self, robots: f64, millicores: f64, memory_bytes: f64) -> f64 {
        let cores = self.cores.max(0.001);
        exact_score(
            self.cpu + millicores / 1000.0 / cores,
            self.executors + robots / self.capacity.max(1) as f64,
            self.memory + memory_bytes / self.memory_bytes.max(1) as f64,
            self.weights,
        )
    }
}

fn score_of(cpu: f64, executors: f64, memory: f64, w: LoadWeights) -> f64 {
    (exact_score(cpu, executors, memory, w) * 10.0).round() / 10.0
}

fn exact_score(cpu: f64, executors: f64, memory: f64, w: LoadWeights) -> f64 {
    let total = w.total();
    if total <= 0.0 {
        return 0.0;
    }
    (share(cpu) * f64::from(w.cpu)
        + share(executors) * f64::from(w.executors)
        + share(memory) * f64::from(w.memory))
        / total
        * 100.0
}

/// What a worker used, as measured.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Used {
    /// Cores' worth of CPU over the last minute.
    pub cores: f64,
    pub robots: u64,
    pub memory_bytes: u64,
}

/// What a worker may use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allowed {
    pub cores: f64,
    pub capacity: u64,
    pub memory_bytes: u64,
}

/// What robots cost or are expected to: how many, their CPU and their memory. A
/// slot's measured cost, a robot's declared limits, or a plan's sum of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, utoipa::ToSchema)]
pub struct Cost {
    pub robots: u64,
    /// Thousandths of a core.
    pub millicores: u64,
    pub memory_bytes: u64,
}

impl Cost {
    /// The same cost, said of `n` robots.
    pub fn with_robots(self, n: u64) -> Cost {
        Cost { robots: n, ..self }
    }
}

/// A held slot's measured cost, as its holder records it on the renewal: the sum
/// over its running robots (each weighing the more of what it used and what its
/// `limits` declare), and its heaviest few by name.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, utoipa::ToSchema)]
pub struct SlotCost {
    pub total: Cost,
    pub top: Vec<RobotCost>,
}

/// One robot's weight in a [`SlotCost`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct RobotCost {
    pub name: String,
    pub millicores: u64,
    pub memory_bytes: u64,
}

/// Saturating: a slot's cost may come from a hand-edited document.
impl std::ops::Add for Cost {
    type Output = Cost;
    fn add(self, o: Cost) -> Cost {
        Cost {
            robots: self.robots.saturating_add(o.robots),
            millicores: self.millicores.saturating_add(o.millicores),
            memory_bytes: self.memory_bytes.saturating_add(o.memory_bytes),
        }
    }
}

impl std::iter::Sum for Cost {
    fn sum<I: Iterator<Item = Cost>>(iter: I) -> Cost {
        iter.fold(Cost::default(), |a, b| a + b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(cores_used: f64, robots: u64, mem: u64) -> Load {
        Load::measured(
            Used {
                cores: cores_used,
                robots,
                memory_bytes: mem,
            },
            Allowed {
                cores: 2.0,
                capacity: 100,
                memory_bytes: 1000,
            },
            LoadWeights::default(),
        )
    }

    #[test]
    fn keeper_s_weights_make_the_score() {
        assert_eq!(load(0.0, 0, 0).score(), 0.0);
        assert_eq!(load(2.0, 100, 1000).score(), 100.0);
        // Half the CPU: 64 × 0.5 = 32 of 100.
        assert_eq!(load(1.0, 0, 0).score(), 32.0);
        // A quarter of the executors: 32 × 0.25 = 8.
        assert_eq!(load(0.0, 25, 0).score(), 8.0);
        // All the memory: 4.
        assert_eq!(load(0.0, 0, 1000).score(), 4.0);
        // Over the allowance counts as full, never above 100.
        assert_eq!(load(8.0, 1000, 99_999).score(), 100.0);
    }

    #[test]
    fn weights_parse_with_clear_errors() {
        assert_eq!("64,32,4".parse::<LoadWeights>(), Ok(LoadWeights::default()));
        assert_eq!(
            " 1, 0 ,0".parse::<LoadWeights>(),
            Ok(LoadWeights {
                cpu: 1,
                executors: 0,
                memory: 0
            })
        );
        for (bad, says) in [
            ("64,32", "three whole numbers"),
            ("64,32,4,1", "three whole numbers"),
            ("0,0,0", "not all 0"),
            ("64,-1,4", "EXECUTORS weight \"-1\" is not a whole number"),
            ("a,1,1", "CPU weight"),
            ("1,1,99999", "over 10000"),
        ] {
            let e = bad.parse::<LoadWeights>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert_eq!(LoadWeights::default().to_string(), "64,32,4");
    }

    #[test]
    fn other_weights_change_the_score() {
        let only_cpu = LoadWeights {
            cpu: 1,
            executors: 0,
            memory: 0,
        };
        let l = Load {
            weights: only_cpu,
            ..load(0.5, 100, 1000)
        };
        assert_eq!(l.score(), 25.0);
    }

    #[test]
    fn a_robot_added_raises_the_score_by_its_share() {
        let l = load(0.0, 0, 0);
        // One executor of 100: 0.32 points.
        let one = Cost {
            robots: 1,
            ..Cost::default()
        };
        assert!((l.score_with(one) - 0.32).abs() < 1e-9);
        // A robot that declares 2 cores fills this worker's CPU: 64 + 0.32.
        let hog = Cost {
            robots: 1,
            millicores: 2000,
            memory_bytes: 0,
        };
        assert!((l.score_with(hog) - 64.32).abs() < 1e-9);
        // A part already full stays full.
        assert!((load(2.0, 0, 0).score_with(hog) - 64.32).abs() < 1e-9);
        // Taken away: back to where it was.
        assert!(load(1.0, 1, 0).score_moved(-1.0, -2000.0, 0.0).abs() < 1e-9);
    }

    #[test]
    fn a_missing_allowance_is_no_division_by_zero() {
        let l = Load::measured(
            Used {
                cores: 1.0,
                robots: 3,
                memory_bytes: 5,
            },
            Allowed {
                cores: 0.0,
                capacity: 0,
                memory_bytes: 0,
            },
            LoadWeights::default(),
        );
        assert!(l.score().is_finite());
        assert!((0.0..=100.0).contains(&l.score()));
    }
}
