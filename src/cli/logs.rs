//! `slotpool robot logs NAME [--follow]`: a robot's kept output lines (see
//! [`crate::db::output_log`]), escaped like every other text a robot controls.

use std::time::Duration;

use anyhow::Context as _;
use bson::{Bson, Document};

use crate::db::field::{AT, GEN, LINES, STREAM, TEXT};
use crate::db::store::Store;

/// How often `--follow` looks for new lines (they are kept about once a second).
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

/// One kept line, with the instance (generation) that wrote it.
#[derive(Debug, Clone, PartialEq)]
struct Kept {
    gen: i64,
    n: i64,
    at: Option<bson::DateTime>,
    stream: String,
    text: String,
}

impl Kept {
    /// Lines are ordered by instance, then by number within it.
    fn key(&self) -> (i64, i64) {
        (self.gen, self.n)
    }
}

pub(crate) async fn run(
    store: &Store,
    name: &str,
    lines: usize,
    follow: bool,
    as_json: bool,
) -> anyhow::Result<()> {
    let id = robot_id(store, name).await?;
    let kept = read(store, &id).await?;
    let start = kept.len().saturating_sub(lines);
    let mut last = kept.last().map(Kept::key);
    if kept.is_empty() && !follow {
        eprintln!("{name} has no kept output (only exec robots write output; lines are kept about once a second)");
    }
    for k in &kept[start..] {
        print(k, as_json);
    }
    if !follow {
        return Ok(());
    }
    loop {
        tokio::time::sleep(FOLLOW_EVERY).await;
        if crate::db::robots::by_id(store, &id, &["_id"])
            .await?
            .is_none()
        {
            eprintln!("{name} was deleted");
            return Ok(());
        }
        for k in read(store, &id).await? {
            if last.is_none_or(|l| k.key() > l) {
                print(&k, as_json);
                last = Some(k.key());
            }
        }
    }
}

async fn robot_id(store: &Store, name: &str) -> anyhow::Result<Bson> {
    let d = super::connect::find_robot(store, name, &["_id"]).await?;
    d.get("_id").cloned().context("the robot has no _id")
}

/// The robot's kept lines, oldest first; a malformed entry (the document is hand
/// editable) is skipped.
async fn read(store: &Store, id: &Bson) -> anyhow::Result<Vec<Kept>> {
    let Some(d) = crate::db::output_log::kept(store, id).await? else {
        return Ok(Vec::new());
    };
    Ok(parse(&d))
}

fn parse(d: &Document) -> Vec<Kept> {
    let gen = super::output::int(d, GEN).unwrap_or(0);
    let Ok(lines) = d.get_array(LINES) else {
        return Vec::new();
    };
    lines
        .iter()
        .filter_map(|l| {
            let l = l.as_document()?;
            Some(Kept {
                gen,
                n: super::output::int(l, "n")?,
                at: l.get_datetime(AT).ok().copied(),
                stream: l.get_str(STREAM).unwrap_or("stdout").to_string(),
                text: l.get_str(TEXT).ok()?.to_string(),
            })
        })
        .collect()
}

fn print(k: &Kept, as_json: bool) {
    if as_json {
        let at = k.at.map(|t| t.try_to_rfc3339_string().unwrap_or_default());
        // One object per line (JSON Lines), with every character a terminal could
        // act on escaped as \uXXXX.
        let v = serde_json::json!({
            "gen": k.gen, "n": k.n, "at": at, "stream": k.stream, "text": k.text,
        });
        println!("{}", crate::printable::escape_json(&v.to_string()));
        return;
    }
    let at =
        k.at.and_then(|t| t.try_to_rfc3339_string().ok())
            .unwrap_or_else(|| "-".into());
    let stream = crate::printable::escape(&k.stream);
    println!("{at} {stream:<6} {}", crate::printable::escape(&k.text));
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn kept_lines_parse_and_order_by_instance_then_number() {
        let d = doc! {"_id": 1, "gen": 3_i64, "lines": [
            {"n": 7_i64, "at": bson::DateTime::now(), "stream": "stderr", "text": "x"},
            {"n": "bad", "text": "skipped"},
            "not a document",
            {"n": 8_i64, "text": "y"},
        ]};
        let k = parse(&d);
        assert_eq!(k.len(), 2);
        assert_eq!((k[0].key(), k[0].stream.as_str()), ((3, 7), "stderr"));
        assert_eq!((k[1].key(), k[1].stream.as_str()), ((3, 8), "stdout"));
        assert!(k[1].key() > k[0].key());
        // A later instance's first line comes after an earlier one's last.
        let later = Kept {
            gen: 4,
            n: 1,
            ..k[0].clone()
        };
        assert!(later.key() > k[1].key());
        assert!(parse(&doc! {"_id": 1}).is_empty());
    }
}
