//! The write concern the pool's writes carry: acknowledged by a majority of the
//! replica set and journaled (`w: "majority"`, `j: true`), set explicitly.
//!
//! A primary–secondary–arbiter set defaults to `w: 1`: a claim, a renewal or a
//! checkpoint acknowledged by the primary alone can be rolled back by a failover,
//! and two holders could then both believe they hold a slot. A URI asking for less
//! is refused, unless the operator says `--unsafe-write-concern`.

use mongodb::options::{Acknowledgment, WriteConcern};

/// `w: "majority"`, `j: true`.
pub(crate) fn majority() -> WriteConcern {
    WriteConcern::builder()
        .w(Acknowledgment::Majority)
        .journal(true)
        .build()
}

/// A URI whose write concern is weaker than fencing needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the connection string asks for write concern {asked}, but the pool's lease and \
     robot writes must be acknowledged by a majority and journaled (w=majority, \
     journal=true), or a failover can roll back a claim or a checkpoint; remove \
     the option from the URI, or pass --unsafe-write-concern to accept it knowingly"
)]
pub struct WeakWriteConcern {
    /// What the URI asked, as the URI says it.
    pub asked: String,
}

/// The write concern to use when the URI asked for `asked`: majority and journaled,
/// keeping the URI's `wtimeoutMS`. A weaker `w` (a number of nodes, a custom tag)
/// or `journal=false` is refused, or kept as asked when `unsafe_ok`.
pub(crate) fn choose(
    asked: Option<&WriteConcern>,
    unsafe_ok: bool,
) -> Result<WriteConcern, WeakWriteConcern> {
    let Some(asked) = asked else {
        return Ok(majority());
    };
    let weak_w = match &asked.w {
        None | Some(Acknowledgment::Majority) => None,
        Some(Acknowledgment::Nodes(n)) => Some(format!("w={n}")),
        Some(Acknowledgment::Custom(tag)) => Some(format!("w={tag}")),
        Some(other) => Some(format!("w={other:?}")),
    };
    let weak_j = (asked.journal == Some(false)).then(|| "journal=false".to_string());
    let weak: Vec<String> = [weak_w, weak_j].into_iter().flatten().collect();
    if !weak.is_empty() {
        if unsafe_ok {
            return Ok(asked.clone());
        }
        return Err(WeakWriteConcern {
            asked: weak.join(", "),
        });
    }
    let mut chosen = majority();
    chosen.w_timeout = asked.w_timeout;
    Ok(chosen)
}

/// `command` with the write concern of `coll` (the client's) as its
/// `writeConcern`: the driver adds it to its own write helpers, not to a command run
/// by hand.
pub(crate) fn with_write_concern(
    mut command: bson::Document,
    coll: &mongodb::Collection<bson::Document>,
) -> bson::Document {
    if let Some(wc) = coll.write_concern() {
        if let Ok(wc) = bson::to_document(wc) {
            command.insert("writeConcern", wc);
        }
    }
    command
}

/// How the write concern in force reads in the log and `status`.
pub(crate) fn describe(wc: &WriteConcern) -> String {
    let w = match &wc.w {
        None => "server default".to_string(),
        Some(Acknowledgment::Majority) => "majority".to_string(),
        Some(Acknowledgment::Nodes(n)) => n.to_string(),
        Some(Acknowledgment::Custom(tag)) => tag.clone(),
        Some(other) => format!("{other:?}"),
    };
    let j = match wc.journal {
        Some(true) => "journaled",
        Some(false) => "not journaled",
        None => "journal as the server defaults",
    };
    match wc.w_timeout {
        Some(t) => format!("w={w}, {j}, wtimeout {} ms", t.as_millis()),
        None => format!("w={w}, {j}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn asked(w: Option<Acknowledgment>, journal: Option<bool>) -> WriteConcern {
        let mut wc = WriteConcern::default();
        wc.w = w;
        wc.journal = journal;
        wc
    }

    #[test]
    fn no_write_concern_in_the_uri_means_majority_and_journaled() {
        assert_eq!(choose(None, false), Ok(majority()));
        assert_eq!(choose(Some(&asked(None, None)), false), Ok(majority()));
    }

    #[test]
    fn majority_in_the_uri_is_kept_with_its_timeout_and_journaled() {
        let mut wc = asked(Some(Acknowledgment::Majority), None);
        wc.w_timeout = Some(Duration::from_secs(5));
        let chosen = choose(Some(&wc), false).unwrap();
        assert_eq!(chosen.w, Some(Acknowledgment::Majority));
        assert_eq!(chosen.journal, Some(true));
        assert_eq!(chosen.w_timeout, Some(Duration::from_secs(5)));
    }

    #[test]
    fn a_weaker_write_concern_is_refused_and_named() {
        let one = asked(Some(Acknowledgment::Nodes(1)), None);
        assert_eq!(choose(Some(&one), false).unwrap_err().asked, "w=1");
        let tag = asked(Some(Acknowledgment::Custom("dc".into())), Some(false));
        assert_eq!(
            choose(Some(&tag), false).unwrap_err().asked,
            "w=dc, journal=false"
        );
        let unjournaled = asked(Some(Acknowledgment::Majority), Some(false));
        assert_eq!(
            choose(Some(&unjournaled), false).unwrap_err().asked,
            "journal=false"
        );
        let message = choose(Some(&one), false).unwrap_err().to_string();
        assert!(message.contains("--unsafe-write-concern"), "{message}");
    }

    #[test]
    fn unsafe_keeps_what_the_uri_asked() {
        let one = asked(Some(Acknowledgment::Nodes(1)), None);
        assert_eq!(choose(Some(&one), true), Ok(one));
    }

    #[test]
    fn the_write_concern_in_force_reads_plainly() {
        assert_eq!(describe(&majority()), "w=majority, journaled");
        let one = asked(Some(Acknowledgment::Nodes(1)), None);
        assert_eq!(describe(&one), "w=1, journal as the server defaults");
    }
}
