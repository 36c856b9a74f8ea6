//! How load is stored: a worker's [`Load`] in its heartbeat (`workers.load`) and a
//! held slot's [`SlotCost`] on its renewal (`slots.cost`), and how both are read
//! back. Both documents are anyone's to edit by hand, so a reading that makes no
//! sense is no reading: the caller falls back as if the worker or slot had said
//! nothing.

use bson::{doc, Bson, Document};

use crate::db::field::AT;
use crate::db::store::int;
use crate::load::{Cost, Load, LoadWeights, RobotCost, SlotCost};

/// A share as stored: three decimals are more than a score of one decimal uses.
fn stored_share(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The heartbeat's `load` field.
pub(crate) fn load_doc(l: &Load) -> Document {
    doc! {
        "score": l.score(),
        "cpu": stored_share(l.cpu),
        "executors": stored_share(l.executors),
        "memory": stored_share(l.memory),
        "robots": l.robots as i64,
        "capacity": l.capacity as i64,
        "cores": (l.cores * 1000.0).round() / 1000.0,
        "memory_bytes": l.memory_bytes as i64,
        "weights": [l.weights.cpu as i64, l.weights.executors as i64, l.weights.memory as i64],
    }
}

/// A number field: a double, or a whole number.
fn number(d: &Document, key: &str) -> Option<f64> {
    match d.get(key)? {
        Bson::Double(v) if v.is_finite() => Some(*v),
        _ => int(d, key).map(|v| v as f64),
    }
}

/// A share field: a number from 0 to 1.
fn share(d: &Document, key: &str) -> Option<f64> {
    number(d, key).filter(|v| (0.0..=1.0).contains(v))
}

/// A count field: a whole number, not negative.
fn count(d: &Document, key: &str) -> Option<u64> {
    int(d, key).filter(|v| *v >= 0).map(|v| v as u64)
}

/// A worker's load from its heartbeat document, when it wrote one that makes
/// sense (an older version writes none).
pub(crate) fn load_of(worker: &Document) -> Option<Load> {
    let d = worker.get_document(crate::db::field::LOAD).ok()?;
    let w = d.get_array("weights").ok()?;
    let weight = |i: usize| match w.get(i)? {
        Bson::Int32(v) if (0..=10_000).contains(v) => Some(*v as u32),
        Bson::Int64(v) if (0..=10_000).contains(v) => Some(*v as u32),
        Bson::Double(v) if v.fract() == 0.0 && (0.0..=10_000.0).contains(v) => Some(*v as u32),
        _ => None,
    };
    let weights = LoadWeights {
        cpu: weight(0)?,
        executors: weight(1)?,
        memory: weight(2)?,
    };
    if weights.cpu + weights.executors + weights.memory == 0 {
        return None;
    }
    Some(Load {
        cpu: share(d, "cpu")?,
        executors: share(d, "executors")?,
        memory: share(d, "memory")?,
        robots: count(d, "robots")?,
        capacity: count(d, "capacity").filter(|c| *c > 0)?,
        cores: number(d, "cores").filter(|c| *c > 0.0)?,
        memory_bytes: count(d, "memory_bytes").filter(|m| *m > 0)?,
        weights,
    })
}

/// The renewal's `$set` of a slot's cost, stamped with the server's clock. Robot
/// names are the robots' own: taken as literals, never as expressions.
pub(crate) fn cost_set(c: &SlotCost) -> Document {
    let top: Vec<Bson> = c
        .top
        .iter()
        .map(|r| {
            Bson::Document(doc! {
                "name": &r.name,
                "millicores": r.millicores as i64,
                "memory_bytes": r.memory_bytes as i64,
            })
        })
        .collect();
    doc! {
        "robots": c.total.robots as i64,
        "millicores": c.total.millicores as i64,
        "memory_bytes": c.total.memory_bytes as i64,
        "top": {"$literal": top},
        AT: "$$NOW",
    }
}

/// A slot's recorded cost, when its document has one that makes sense.
pub(crate) fn cost_of(slot: &Document) -> Option<SlotCost> {
    let d = slot.get_document(crate::db::field::COST).ok()?;
    let total = Cost {
        robots: count(d, "robots")?,
        millicores: count(d, "millicores")?,
        memory_bytes: count(d, "memory_bytes")?,
    };
    let top = d
        .get_array("top")
        .map(|a| {
            a.iter()
                .filter_map(Bson::as_document)
                .filter_map(|r| {
                    Some(RobotCost {
                        name: r.get_str("name").ok()?.to_string(),
                        millicores: count(r, "millicores")?,
                        memory_bytes: count(r, "memory_bytes")?,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    Some(SlotCost { total, top })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{Allowed, Used};

    #[test]
    fn a_load_round_trips_and_nonsense_reads_as_none() {
        let l = Load::measured(
            Used {
                cores: 0.5,
                robots: 10,
                memory_bytes: 100,
            },
            Allowed {
                cores: 2.0,
                capacity: 1000,
                memory_bytes: 1000,
            },
            LoadWeights::default(),
        );
        let worker = doc! {"load": load_doc(&l)};
        assert_eq!(load_of(&worker), Some(l));
        assert_eq!(load_of(&doc! {}), None);
        for (key, bad) in [
            ("cpu", Bson::Double(1.5)),
            ("cpu", Bson::String("x".into())),
            ("capacity", Bson::Int64(0)),
            ("cores", Bson::Double(f64::NAN)),
            ("robots", Bson::Int64(-1)),
            (
                "weights",
                Bson::Array(vec![Bson::Int32(0), Bson::Int32(0), Bson::Int32(0)]),
            ),
        ] {
            let mut d = load_doc(&l);
            d.insert(key, bad.clone());
            assert_eq!(load_of(&doc! {"load": d}), None, "{key}: {bad}");
        }
    }

    #[test]
    fn a_cost_round_trips_and_names_stay_literal() {
        let c = SlotCost {
            total: Cost {
                robots: 3,
                millicores: 1200,
                memory_bytes: 5 << 20,
            },
            top: vec![RobotCost {
                name: "$where".into(),
                millicores: 1000,
                memory_bytes: 1 << 20,
            }],
        };
        let set = cost_set(&c);
        assert!(set.get_document("top").unwrap().contains_key("$literal"));
        // As the server stores it: the literal unwrapped.
        let mut stored = set.clone();
        stored.insert(
            "top",
            set.get_document("top")
                .unwrap()
                .get("$literal")
                .unwrap()
                .clone(),
        );
        assert_eq!(cost_of(&doc! {"cost": stored}), Some(c));
        assert_eq!(
            cost_of(&doc! {"cost": {"robots": -1, "millicores": 0, "memory_bytes": 0}}),
            None
        );
    }
}
