//! The pure rules of placement by load: where new robots go ([`plan_by_load`]) and
//! which robots `rebalance --by load` moves ([`plan_load_rebalance`]), from each
//! slot's holder's last measured [`Load`] and the slots' recorded costs. No I/O:
//! [`crate::pool::placement`] reads the pool and carries the plans out.

use std::collections::{BTreeMap, HashMap};

use crate::db::placement::SlotLoad;
use crate::load::{Cost, Load};

use crate::load::SCORE_TIE;

/// How far apart (in score points, 0 to 100) `rebalance --by load` leaves the
/// busiest and the idlest holder, by default: a point, the noise of a minute's
/// measure of an idle worker. Holders on one host share its cores, so a robot that
/// burns a twentieth of a core on 2 cores is 1.6 points: a band of 5 left holders
/// with 0 and 3 such robots alone (docs/bench/2026-11-29-placement-by-load.md).
pub(crate) const LOAD_BAND: f64 = 1.0;

/// The least a move must lower the higher of its two holders' scores, in points:
/// an idle robot's executor share (0.03 points at the default capacity) is not
/// worth a restart.
const MIN_GAIN: f64 = 0.5;

/// Robots, thousandths of a core and bytes: what a plan adds to a holder (or,
/// negative, takes away).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Delta {
    robots: f64,
    millicores: f64,
    memory_bytes: f64,
}

impl Delta {
    fn of(c: Cost) -> Delta {
        Delta {
            robots: c.robots as f64,
            millicores: c.millicores as f64,
            memory_bytes: c.memory_bytes as f64,
        }
    }

    fn times(self, k: f64) -> Delta {
        Delta {
            robots: self.robots * k,
            millicores: self.millicores * k,
            memory_bytes: self.memory_bytes * k,
        }
    }
}

impl std::ops::AddAssign for Delta {
    fn add_assign(&mut self, o: Delta) {
        self.robots += o.robots;
        self.millicores += o.millicores;
        self.memory_bytes += o.memory_bytes;
    }
}

/// A holder as a plan sees it: its last measured load, and what it carries beyond
/// it: robots bound since its heartbeat counted them, the CPU and memory its slots'
/// recorded costs weigh (declared limits included) above what it measured, and
/// what the plan has placed on it or taken away so far.
#[derive(Debug, Clone, Copy)]
struct Carried {
    load: Load,
    extra: Delta,
}

impl Carried {
    fn new(load: Load, slots: &[&SlotLoad]) -> Carried {
        let robots = slots.iter().fold(0_i64, |n, s| n.saturating_add(s.robots));
        // Each slot weighs what its holder recorded, or what its robots declare
        // when that is more (robots placed since, not measured yet).
        let cost: Cost = slots
            .iter()
            .map(|s| {
                let recorded = s.cost.as_ref().map(|c| c.total).unwrap_or_default();
                Cost {
                    robots: recorded.robots,
                    millicores: recorded.millicores.max(s.declared.millicores),
                    memory_bytes: recorded.memory_bytes.max(s.declared.memory_bytes),
                }
            })
            .sum();
        let measured_mc = load.cpu * load.cores * 1000.0;
        let measured_mem = load.memory * load.memory_bytes as f64;
        Carried {
            load,
            extra: Delta {
                robots: robots.saturating_sub(load.robots as i64).max(0) as f64,
                millicores: (cost.millicores as f64 - measured_mc).max(0.0),
                memory_bytes: (cost.memory_bytes as f64 - measured_mem).max(0.0),
            },
        }
    }

    /// Its score with `more` on top of what it carries: what it measured, in whole
    /// [`SCORE_TIE`] steps (a minute's measure of an idle worker varies by a few
    /// tenths of a point: two idle holders are equal, and their robots spread by
    /// count), plus exactly what the plan knows it adds (robots, what they declare
    /// or were measured to cost).
    fn score_with(&self, more: Delta) -> f64 {
        let measured = self.load.score_moved(0.0, 0.0, 0.0);
        let mut d = self.extra;
        d += more;
        let added = self
            .load
            .score_moved(d.robots, d.millicores, d.memory_bytes)
            - measured;
        (measured / SCORE_TIE).floor() * SCORE_TIE + added
    }

    fn score(&self) -> f64 {
        self.score_with(Delta::default())
    }
}

/// The slots' holders as a plan sees them, or None when a slot's holder is
/// unknown (unheld, or no load in a live heartbeat).
fn known_holders<'a>(
    slots: &'a [SlotLoad],
    holders: &HashMap<String, Load>,
) -> Option<BTreeMap<&'a str, Carried>> {
    let mut out = BTreeMap::new();
    for s in slots {
        let h = s.holder.as_deref()?;
        let load = *holders.get(h)?;
        if !out.contains_key(h) {
            let mine: Vec<&SlotLoad> = slots
                .iter()
                .filter(|x| x.holder.as_deref() == Some(h))
                .collect();
            out.insert(h, Carried::new(load, &mine));
        }
    }
    Some(out)
}

/// Spreads `n` robots, each expected to cost `each`, over `slots` by their holders'
/// load: each goes to the slot whose holder's score, with what it already carries
/// and this robot on top ([`Carried::score_with`]), is lowest, then to the one with
/// the fewest robots, then by id. None when some slot's holder is unknown: the
/// caller places by counts.
pub(crate) fn plan_by_load(
    slots: &[SlotLoad],
    holders: &HashMap<String, Load>,
    n: usize,
    each: Cost,
) -> Option<Vec<usize>> {
    if slots.is_empty() {
        return None;
    }
    let mut known = known_holders(slots, holders)?;
    let mut counts: Vec<i64> = slots.iter().map(|s| s.robots).collect();
    let mut take = vec![0usize; slots.len()];
    let each = Delta::of(Cost {
        robots: each.robots.max(1),
        ..each
    });
    let holder = |i: usize| slots[i].holder.as_deref().expect("a known holder");
    for _ in 0..n {
        let scores: Vec<f64> = (0..slots.len())
            .map(|i| known[holder(i)].score_with(each))
            .collect();
        let i = (0..slots.len())
            .min_by(|&a, &b| {
                scores[a]
                    .total_cmp(&scores[b])
                    .then(counts[a].cmp(&counts[b]))
                    .then(a.cmp(&b))
            })
            .expect("slots");
        known.get_mut(holder(i)).expect("known").extra += each;
        counts[i] += 1;
        take[i] += 1;
    }
    Some(take)
}

/// One robot to move in a load rebalance.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LoadMove {
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) robot: String,
}

/// Why a load rebalance cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LoadUnknown {
    #[error("{0} has no live holder with a measured load: rebalance --by count, or wait for a worker to hold it")]
    Slot(String),
}

/// A load rebalance's plan: its moves, and each holder's score before and after
/// them (as predicted from the moved robots' measured costs).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LoadPlan {
    pub(crate) moves: Vec<LoadMove>,
    /// `(holder, before, after)`, by holder.
    pub(crate) scores: Vec<(String, f64, f64)>,
}

/// Each slot's movable robots, heaviest first, with what each weighs: those its
/// recorded cost names.
fn movable(slots: &[SlotLoad]) -> Vec<Vec<(String, Delta)>> {
    slots
        .iter()
        .map(|s| {
            let Some(c) = &s.cost else {
                return Vec::new();
            };
            c.top
                .iter()
                .filter(|r| r.millicores > 0 || r.memory_bytes > 0)
                .map(|r| {
                    let weight = Cost {
                        robots: 1,
                        millicores: r.millicores,
                        memory_bytes: r.memory_bytes,
                    };
                    (r.name.clone(), Delta::of(weight))
                })
                .collect()
        })
        .collect()
}

/// Moves the heaviest measured robots from the busiest holders' slots to the idlest
/// holder's slots (to the one with the fewest robots), one at a time, while the
/// busiest and the idlest holder are more than `band` points apart and a move
/// lowers the higher of its two holders by [`MIN_GAIN`]; at most `max_moves`. From
/// the busiest holder down, the first that has such a move makes it. Only the
/// robots a slot's cost names (its few heaviest) can be moved: a rebalance after
/// the next measurement moves more when needed.
pub(crate) fn plan_load_rebalance(
    slots: &[SlotLoad],
    holders: &HashMap<String, Load>,
    band: f64,
    max_moves: usize,
) -> Result<LoadPlan, LoadUnknown> {
    let Some(mut known) = known_holders(slots, holders) else {
        let unknown = slots
            .iter()
            .find(|s| s.holder.as_ref().is_none_or(|h| !holders.contains_key(h)))
            .map(|s| s.id.clone())
            .unwrap_or_default();
        return Err(LoadUnknown::Slot(unknown));
    };
    let mut counts: Vec<i64> = slots.iter().map(|s| s.robots).collect();
    let mut movable = movable(slots);
    let before: Vec<(String, f64)> = known
        .iter()
        .map(|(h, c)| (h.to_string(), c.score()))
        .collect();
    let mut moves = Vec::new();
    while moves.len() < max_moves {
        let Some(m) = best_move(slots, &known, &movable, band) else {
            break;
        };
        let to = (0..slots.len())
            .filter(|&i| slots[i].holder.as_deref() == Some(m.to))
            .min_by_key(|&i| (counts[i], i))
            .expect("the idlest holds a slot");
        let (name, weight) = movable[m.slot].remove(m.robot);
        let (hi, lo) = (m.from.to_string(), m.to.to_string());
        known.get_mut(hi.as_str()).expect("known").extra += weight.times(-1.0);
        known.get_mut(lo.as_str()).expect("known").extra += weight;
        counts[m.slot] -= 1;
        counts[to] += 1;
        moves.push(LoadMove {
            from: slots[m.slot].id.clone(),
            to: slots[to].id.clone(),
            robot: name,
        });
    }
    let scores = before
        .into_iter()
        .map(|(h, b)| {
            let after = known[h.as_str()].score();
            (h, b, after)
        })
        .collect();
    Ok(LoadPlan { moves, scores })
}

/// The next move of a load rebalance: robot `robot` of `movable[slot]`, from
/// holder `from` to holder `to`.
struct NextMove<'a> {
    from: &'a str,
    to: &'a str,
    slot: usize,
    robot: usize,
}

/// See [`plan_load_rebalance`].
fn best_move<'a>(
    slots: &[SlotLoad],
    known: &BTreeMap<&'a str, Carried>,
    movable: &[Vec<(String, Delta)>],
    band: f64,
) -> Option<NextMove<'a>> {
    let mut by_score: Vec<(&'a str, f64)> = known.iter().map(|(h, c)| (*h, c.score())).collect();
    // Busiest first (ties by id).
    by_score.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    let (lo, lo_score) = *by_score
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(b.0)))?;
    for &(hi, hi_score) in &by_score {
        if hi_score - lo_score <= band {
            return None;
        }
        // The robot whose move leaves the higher of the two lowest.
        let mut best: Option<(f64, usize, usize)> = None;
        for (si, s) in slots.iter().enumerate() {
            if s.holder.as_deref() != Some(hi) {
                continue;
            }
            for (ri, (_, weight)) in movable[si].iter().enumerate() {
                let new_hi = known[hi].score_with(weight.times(-1.0));
                let new_lo = known[lo].score_with(*weight);
                let worst = new_hi.max(new_lo);
                if worst <= hi_score - MIN_GAIN && best.is_none_or(|b| worst < b.0) {
                    best = Some((worst, si, ri));
                }
            }
        }
        if let Some((_, slot, robot)) = best {
            return Some(NextMove {
                from: hi,
                to: lo,
                slot,
                robot,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(id: &str, robots: i64) -> SlotLoad {
        SlotLoad {
            id: id.into(),
            robots,
            seen: Some(robots),
            holder: None,
            cost: None,
            declared: Cost::default(),
        }
    }

    /// A slot held by `holder`, its robots costing `millicores` in all, the
    /// heaviest named.
    fn held(id: &str, robots: i64, holder: &str, top: &[(&str, u64)]) -> SlotLoad {
        let millicores = top.iter().map(|(_, m)| m).sum();
        SlotLoad {
            holder: Some(holder.into()),
            cost: Some(crate::load::SlotCost {
                total: Cost {
                    robots: robots as u64,
                    millicores,
                    memory_bytes: 0,
                },
                top: top
                    .iter()
                    .map(|(n, m)| crate::load::RobotCost {
                        name: n.to_string(),
                        millicores: *m,
                        memory_bytes: 0,
                    })
                    .collect(),
            }),
            ..load(id, robots)
        }
    }

    /// A holder on 2 cores that measured `millicores` of CPU running `robots`.
    fn measured(millicores: u64, robots: u64) -> Load {
        Load::measured(
            crate::load::Used {
                cores: millicores as f64 / 1000.0,
                robots,
                memory_bytes: 0,
            },
            crate::load::Allowed {
                cores: 2.0,
                capacity: 1000,
                memory_bytes: 1 << 30,
            },
            crate::load::LoadWeights::default(),
        )
    }

    fn test_moves(
        slots: &[SlotLoad],
        holders: &HashMap<String, Load>,
        band: f64,
        max_moves: usize,
    ) -> Result<Vec<LoadMove>, LoadUnknown> {
        Ok(plan_load_rebalance(slots, holders, band, max_moves)?.moves)
    }

    fn holders(h: &[(&str, Load)]) -> HashMap<String, Load> {
        h.iter().map(|(id, l)| (id.to_string(), *l)).collect()
    }

    #[test]
    fn new_robots_go_to_the_idlest_holder_not_the_emptiest_slot() {
        // Same count; a's holder burns a core.
        let slots = [
            held("a", 5, "w1", &[("hog", 1000)]),
            held("b", 5, "w2", &[]),
        ];
        let h = holders(&[("w1", measured(1000, 5)), ("w2", measured(10, 5))]);
        assert_eq!(
            plan_by_load(&slots, &h, 10, Cost::default()),
            Some(vec![0, 10])
        );
        // Robots that cost nothing spread evenly between equals, by count, and
        // between holders whose measures differ by noise.
        let h = holders(&[("w1", measured(10, 5)), ("w2", measured(10, 5))]);
        let even = [held("a", 5, "w1", &[]), held("b", 5, "w2", &[])];
        assert_eq!(
            plan_by_load(&even, &h, 10, Cost::default()),
            Some(vec![5, 5])
        );
        let h = holders(&[("w1", measured(20, 5)), ("w2", measured(5, 5))]);
        assert_eq!(
            plan_by_load(&even, &h, 10, Cost::default()),
            Some(vec![5, 5])
        );
    }

    #[test]
    fn declared_limits_spread_heavy_robots() {
        let h = holders(&[("w1", measured(0, 0)), ("w2", measured(0, 0))]);
        let slots = [held("a", 0, "w1", &[]), held("b", 0, "w2", &[])];
        let heavy = Cost {
            robots: 1,
            millicores: 500,
            memory_bytes: 0,
        };
        assert_eq!(plan_by_load(&slots, &h, 4, heavy), Some(vec![2, 2]));
        // A slot whose robots declared 2 cores weighs that before it is measured.
        let slots = [
            held("a", 1, "w1", &[("declared", 2000)]),
            held("b", 0, "w2", &[]),
        ];
        assert_eq!(
            plan_by_load(&slots, &h, 3, Cost::default()),
            Some(vec![0, 3])
        );
    }

    #[test]
    fn robots_placed_since_the_last_measure_weigh_what_they_declare() {
        // One robot declaring half a core was placed on a; its holder has not
        // measured it yet. The next one declaring as much goes to b.
        let h = holders(&[("w1", measured(0, 0)), ("w2", measured(0, 0))]);
        let a = SlotLoad {
            declared: Cost {
                robots: 1,
                millicores: 500,
                memory_bytes: 0,
            },
            ..held("a", 1, "w1", &[])
        };
        let heavy = Cost {
            robots: 1,
            millicores: 500,
            memory_bytes: 0,
        };
        let slots = [a, held("b", 0, "w2", &[])];
        assert_eq!(plan_by_load(&slots, &h, 1, heavy), Some(vec![0, 1]));
    }

    #[test]
    fn robots_bound_since_the_heartbeat_count_against_their_holder() {
        // w2 measured nothing yet, but 100 robots were placed on it since.
        let h = holders(&[("w1", measured(0, 0)), ("w2", measured(0, 0))]);
        let slots = [held("a", 0, "w1", &[]), held("b", 100, "w2", &[])];
        assert_eq!(
            plan_by_load(&slots, &h, 10, Cost::default()),
            Some(vec![10, 0])
        );
    }

    #[test]
    fn an_unknown_holder_falls_back_to_counts() {
        let h = holders(&[("w1", measured(0, 0))]);
        let slots = [held("a", 0, "w1", &[]), load("b", 3)];
        assert_eq!(plan_by_load(&slots, &h, 1, Cost::default()), None);
        let slots = [held("a", 0, "w1", &[]), held("b", 0, "gone", &[])];
        assert_eq!(plan_by_load(&slots, &h, 1, Cost::default()), None);
        assert!(matches!(
            test_moves(&slots, &h, LOAD_BAND, 10),
            Err(LoadUnknown::Slot(s)) if s == "b"
        ));
    }

    #[test]
    fn a_load_rebalance_moves_the_hogs_apart_and_stops_within_the_band() {
        // w1 runs two hogs of a core each on 2 cores; w2 and w3 are idle.
        let slots = [
            held(
                "a",
                3,
                "w1",
                &[("hog-1", 1000), ("hog-2", 1000), ("idle", 1)],
            ),
            held("b", 3, "w2", &[]),
            held("c", 3, "w3", &[]),
        ];
        let h = holders(&[
            ("w1", measured(2000, 3)),
            ("w2", measured(0, 3)),
            ("w3", measured(0, 3)),
        ]);
        let m = test_moves(&slots, &h, LOAD_BAND, 10).unwrap();
        let moved: Vec<(&str, &str)> = m
            .iter()
            .map(|m| (m.robot.as_str(), m.to.as_str()))
            .collect();
        // One hog each on two holders is as even as two hogs on three get: the
        // idle robot is not worth moving.
        assert_eq!(moved, vec![("hog-1", "b")], "{m:?}");
        // Within the band: nothing to do.
        let close = holders(&[
            ("w1", measured(100, 3)),
            ("w2", measured(0, 3)),
            ("w3", measured(0, 3)),
        ]);
        let light = [
            held("a", 3, "w1", &[("small", 100)]),
            held("b", 3, "w2", &[]),
            held("c", 3, "w3", &[]),
        ];
        assert!(test_moves(&light, &close, LOAD_BAND, 10)
            .unwrap()
            .is_empty());
        // A move that would only swap who is busiest is not made.
        let one = [
            held("a", 1, "w1", &[("hog", 2000)]),
            held("b", 1, "w2", &[]),
        ];
        let h = holders(&[("w1", measured(2000, 1)), ("w2", measured(0, 1))]);
        assert!(test_moves(&one, &h, LOAD_BAND, 10).unwrap().is_empty());
        // At most max_moves.
        assert_eq!(
            test_moves(
                &slots,
                &holders(&[
                    ("w1", measured(2000, 3)),
                    ("w2", measured(0, 3)),
                    ("w3", measured(0, 3)),
                ]),
                LOAD_BAND,
                1
            )
            .unwrap()
            .len(),
            1
        );
    }
}
