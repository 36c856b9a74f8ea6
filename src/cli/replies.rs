//! What the CLI's actions print with `--json`: one typed reply per action, as the
//! listings have, so that a field's name is written once and pinned by a test.

use serde::Serialize;

/// `robot delete --json`.
#[derive(Debug, Serialize)]
pub(super) struct Deleted<'a> {
    pub(crate) deleted: &'a str,
    pub(crate) slot: Option<String>,
}

/// `robot move --json`: `changed` is false for a move to the robot's own slot;
/// `repaired` when an earlier move had been cut off and this one told the holder.
#[derive(Debug, Serialize)]
pub(super) struct Moved<'a> {
    pub(crate) moved: &'a str,
    pub(crate) from: String,
    pub(crate) to: &'a str,
    pub(crate) changed: bool,
    pub(crate) repaired: bool,
}

/// `robot pause --json`.
#[derive(Debug, Serialize)]
pub(super) struct Paused<'a> {
    pub(crate) paused: &'a str,
    pub(crate) slot: Option<String>,
}

/// `robot resume --json`.
#[derive(Debug, Serialize)]
pub(super) struct Resumed<'a> {
    pub(crate) resumed: &'a str,
    pub(crate) slot: Option<String>,
}

/// `robot restart --json`.
#[derive(Debug, Serialize)]
pub(super) struct Restarted<'a> {
    pub(crate) restarted: &'a str,
    pub(crate) slot: Option<String>,
}

/// `robot trigger --json`.
#[derive(Debug, Serialize)]
pub(super) struct Triggered<'a> {
    pub(crate) triggered: &'a str,
    pub(crate) slot: Option<String>,
}

/// `robot update --json`: what changed, whether the holder applied it, and which
/// worker did (`worker` only once applied).
#[derive(Debug, Serialize)]
pub(super) struct Updated<'a> {
    pub(crate) updated: &'a str,
    pub(crate) changes: &'a [String],
    pub(crate) applied: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) worker: Option<Option<String>>,
}

/// `robot update --dry-run --json`.
#[derive(Debug, Serialize)]
pub(super) struct DryRun<'a> {
    pub(crate) dry_run: bool,
    pub(crate) robot: &'a str,
    pub(crate) changes: &'a [String],
}

/// `robot create --json`: each robot made, and its slot.
#[derive(Debug, Serialize)]
pub(super) struct Created<'a> {
    pub(crate) created: Vec<CreatedRobot<'a>>,
}

#[derive(Debug, Serialize)]
pub(super) struct CreatedRobot<'a> {
    pub(crate) name: &'a str,
    pub(crate) slot: &'a str,
}

/// `rebalance --json`: the moves (done, or planned with `--dry-run`), and the
/// robots per slot before and after.
#[derive(Debug, Serialize)]
pub(super) struct Rebalanced<'a> {
    pub(crate) dry_run: bool,
    pub(crate) moves: Vec<RebalanceMove<'a>>,
    pub(crate) before: std::collections::BTreeMap<String, i64>,
    pub(crate) after: std::collections::BTreeMap<String, i64>,
    /// `--by load`: each holder's load score before, and as planned after.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub(crate) scores: std::collections::BTreeMap<String, HolderScores>,
}

/// A holder's load score around a rebalance by load.
#[derive(Debug, Serialize)]
pub(super) struct HolderScores {
    pub(crate) before: f64,
    pub(crate) after: f64,
}

#[derive(Debug, Serialize)]
pub(super) struct RebalanceMove<'a> {
    pub(crate) from: &'a str,
    pub(crate) to: &'a str,
    pub(crate) robots: Vec<&'a str>,
    pub(crate) moved: u64,
    pub(crate) refused: Option<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(v: impl Serialize) -> Vec<String> {
        let v = serde_json::to_value(v).unwrap();
        let mut k: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        k.sort();
        k
    }

    #[test]
    fn every_replys_field_names_are_pinned() {
        let slot = || Some("slot-001".to_string());
        assert_eq!(
            keys(Deleted {
                deleted: "r",
                slot: slot()
            }),
            ["deleted", "slot"]
        );
        assert_eq!(
            keys(Moved {
                moved: "r",
                from: "a".into(),
                to: "b",
                changed: true,
                repaired: false
            }),
            ["changed", "from", "moved", "repaired", "to"]
        );
        assert_eq!(
            keys(Paused {
                paused: "r",
                slot: slot()
            }),
            ["paused", "slot"]
        );
        assert_eq!(
            keys(Resumed {
                resumed: "r",
                slot: slot()
            }),
            ["resumed", "slot"]
        );
        assert_eq!(
            keys(Restarted {
                restarted: "r",
                slot: slot()
            }),
            ["restarted", "slot"]
        );
        assert_eq!(
            keys(Triggered {
                triggered: "r",
                slot: slot()
            }),
            ["slot", "triggered"]
        );
        let changes = ["spec.x".to_string()];
        let not_applied = Updated {
            updated: "r",
            changes: &[],
            applied: false,
            worker: None,
        };
        assert_eq!(keys(not_applied), ["applied", "changes", "updated"]);
        let applied = Updated {
            updated: "r",
            changes: &changes,
            applied: true,
            worker: Some(None),
        };
        assert_eq!(keys(applied), ["applied", "changes", "updated", "worker"]);
        assert_eq!(
            keys(DryRun {
                dry_run: true,
                robot: "r",
                changes: &changes
            }),
            ["changes", "dry_run", "robot"]
        );
        let created = Created {
            created: vec![CreatedRobot {
                name: "r",
                slot: "s",
            }],
        };
        assert_eq!(keys(&created), ["created"]);
        let rebalanced = Rebalanced {
            dry_run: true,
            moves: vec![RebalanceMove {
                from: "a",
                to: "b",
                robots: vec!["r"],
                moved: 0,
                refused: None,
            }],
            before: [("a".to_string(), 1)].into(),
            after: [("b".to_string(), 1)].into(),
            scores: Default::default(),
        };
        assert_eq!(keys(&rebalanced), ["after", "before", "dry_run", "moves"]);
        assert_eq!(
            keys(&rebalanced.moves[0]),
            ["from", "moved", "refused", "robots", "to"]
        );
        assert_eq!(
            serde_json::to_value(&created).unwrap()["created"][0],
            serde_json::json!({"name": "r", "slot": "s"})
        );
    }
}
