//! What one stdout line of an `exec` robot means: a checkpoint, a checkpoint that
//! cannot be stored, or output to log. Pure, unit-tested.
//!
//! `{"checkpoint": {...}}` and nothing else is a checkpoint. A line that begins
//! `{"checkpoint"` but is not exactly that (bad BSON, an extra key) fails the robot
//! rather than silently losing its state as a log line. `{"heartbeat": true}` is a
//! sign of life for a robot with `heartbeat_timeout`, neither stored nor logged.

use bson::Document;

use super::output;

/// What one stdout line means.
#[derive(Debug, PartialEq)]
pub(crate) enum Line {
    Checkpoint(Document),
    /// Meant as a checkpoint, but it cannot be stored as it is: why.
    BadCheckpoint(String),
    /// `{"heartbeat": true}`: the robot is alive.
    Heartbeat,
    Log(String),
}

/// Parses a stdout line (`cut`: bytes skipped past the line bound). A line that
/// begins `{"checkpoint"` is meant as a checkpoint; `{"checkpoint": {...}}` and
/// nothing else is one. One that cannot become BSON exactly (an integer beyond 64
/// bits, `1e400`, a value that is not an object, a line cut short) or that has
/// another key beside `checkpoint` is refused, never logged as if it were output.
pub(crate) fn parse_line(line: &str, cut: usize) -> Line {
    let trimmed = line.trim();
    if cut == 0 && is_heartbeat(trimmed) {
        return Line::Heartbeat;
    }
    let meant = trimmed
        .strip_prefix('{')
        .is_some_and(|rest| rest.trim_start().starts_with("\"checkpoint\""));
    if !meant {
        return Line::Log(line.to_string());
    }
    if cut > 0 {
        return Line::BadCheckpoint(format!(
            "the checkpoint line is longer than {} bytes",
            output::MAX_STDOUT_LINE
        ));
    }
    let value: serde_json::Value = match serde_json::from_str(trimmed) {
        Ok(v) => v,
        Err(e) => return Line::BadCheckpoint(format!("not valid JSON: {e}")),
    };
    let serde_json::Value::Object(mut m) = value else {
        return Line::Log(line.to_string());
    };
    let checkpoint = m.remove("checkpoint");
    if !m.is_empty() {
        let extra: Vec<String> = m
            .keys()
            .map(|k| output::shown(&format!("{k:?}"), 0))
            .collect();
        return Line::BadCheckpoint(format!(
            "a checkpoint line holds \"checkpoint\" and nothing else; it also had {} \
             (put such fields inside the checkpoint, or print them on a line of their own)",
            extra.join(", ")
        ));
    }
    match checkpoint {
        Some(v @ serde_json::Value::Object(_)) => {
            if let Some(n) = oversized_integer(trimmed) {
                return Line::BadCheckpoint(format!(
                    "the integer {n} does not fit in 64 bits (store it as a string)"
                ));
            }
            match bson::to_document(&v) {
                Ok(d) => Line::Checkpoint(d),
                Err(e) => Line::BadCheckpoint(format!("cannot be stored as BSON: {e}")),
            }
        }
        Some(other) => Line::BadCheckpoint(format!(
            "\"checkpoint\" must be a JSON object, found {}",
            output::shown(&other.to_string(), 0)
        )),
        None => Line::Log(line.to_string()),
    }
}

/// `{"heartbeat": true}` with any spacing, and nothing else.
fn is_heartbeat(trimmed: &str) -> bool {
    let squeezed: String = trimmed.chars().filter(|c| !c.is_whitespace()).collect();
    squeezed == r#"{"heartbeat":true}"#
}

/// The first integer literal in JSON text (outside strings) that does not fit in
/// an i64: serde_json would silently turn it into an inexact float.
fn oversized_integer(json: &str) -> Option<&str> {
    let bytes = json.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                i += 1;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                let is_float = i < bytes.len() && matches!(bytes[i], b'.' | b'e' | b'E');
                let token = &json[start..i];
                if !is_float && token.parse::<i64>().is_err() {
                    return Some(token);
                }
                while i < bytes.len()
                    && matches!(bytes[i], b'.' | b'e' | b'E' | b'+' | b'-' | b'0'..=b'9')
                {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    #[test]
    fn a_heartbeat_is_exactly_that() {
        assert_eq!(parse_line(r#"{"heartbeat": true}"#, 0), Line::Heartbeat);
        assert_eq!(parse_line(" { \"heartbeat\" :true } ", 0), Line::Heartbeat);
        for other in [
            r#"{"heartbeat": false}"#,
            r#"{"heartbeat": true, "x": 1}"#,
            r#"heartbeat"#,
            r#"{"heartbeat": "true"}"#,
        ] {
            assert_eq!(parse_line(other, 0), Line::Log(other.into()), "{other}");
        }
        // A line cut short is not one.
        assert!(matches!(
            parse_line(r#"{"heartbeat": true}"#, 5),
            Line::Log(_)
        ));
    }

    #[test]
    fn lines() {
        assert_eq!(
            parse_line(r#"{"checkpoint": {"n": 3}}"#, 0),
            Line::Checkpoint(doc! {"n": 3_i64})
        );
        assert!(matches!(parse_line("hello", 0), Line::Log(_)));
        assert!(matches!(
            parse_line(r#"{"level": "info"}"#, 0),
            Line::Log(_)
        ));
    }

    #[test]
    fn a_checkpoint_with_another_key_is_refused_not_logged() {
        for line in [
            r#"{"checkpoint": {"n": 2}, "at": 1700000000}"#,
            r#"{"checkpoint": {}, "x": 1}"#,
            r#"{ "checkpoint": {"n": 2}, "checkpoint_note": "late", "at": 1}"#,
        ] {
            match parse_line(line, 0) {
                Line::BadCheckpoint(e) => {
                    assert!(
                        e.contains("nothing else") && e.contains("\""),
                        "{line}: {e}"
                    )
                }
                other => panic!("{line}: {other:?}"),
            }
        }
        match parse_line(r#"{"checkpoint": {"n": 2}, "at": 1700000000}"#, 0) {
            Line::BadCheckpoint(e) => assert!(e.contains(r#""at""#), "{e}"),
            other => panic!("{other:?}"),
        }
        // A log line that merely mentions a checkpoint later is still output.
        assert!(matches!(
            parse_line(r#"{"level": "info", "checkpoint": {"n": 1}}"#, 0),
            Line::Log(_)
        ));
    }

    #[test]
    fn unstorable_checkpoints_are_refused_not_logged() {
        for (line, why) in [
            (r#"{"checkpoint": 3}"#, "must be a JSON object"),
            (r#"{"checkpoint": {"n": 1e400}}"#, "not valid JSON"),
            (
                r#"{"checkpoint": {"n": 9223372036854775808}}"#,
                "9223372036854775808",
            ),
            (
                r#"{"checkpoint": {"n": -99999999999999999999}}"#,
                "does not fit in 64 bits",
            ),
            (r#"{ "checkpoint": {"n": 1"#, "not valid JSON"),
        ] {
            match parse_line(line, 0) {
                Line::BadCheckpoint(e) => assert!(e.contains(why), "{line}: {e}"),
                other => panic!("{line}: {other:?}"),
            }
        }
        assert!(matches!(
            parse_line(r#"{"checkpoint": {"n": 1}}"#, 10),
            Line::BadCheckpoint(_)
        ));
        // Big numbers inside strings, floats and i64's extremes are fine.
        assert_eq!(
            parse_line(
                r#"{"checkpoint": {"s": "99999999999999999999", "f": 1.5e300, "min": -9223372036854775808}}"#,
                0
            ),
            Line::Checkpoint(doc! {"s": "99999999999999999999", "f": 1.5e300, "min": i64::MIN})
        );
    }
}
