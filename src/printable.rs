//! Text from documents is hostile: robot names, errors, contexts and robot output
//! are written by whoever can write to the database (or by the robot itself), and a
//! terminal executes escape sequences. Everything slotpool prints for people goes
//! through [`escape`]: control characters (C0, DEL, C1) and the bidirectional
//! overrides that can reorder what a reader sees become visible `\u{..}` escapes, so
//! a name can neither move the cursor, recolour the screen, nor forge a log line.
//!
//! The same functions hide the database's credentials ([`crate::secrets::scrub`]).
//!
//! Robot names are checked at creation against [`check_name`]'s grammar.

use std::borrow::Cow;

/// The longest robot name, in characters.
pub(crate) const MAX_NAME_CHARS: usize = 200;

/// Characters that must never reach a terminal raw.
fn dangerous(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}')
}

/// `s` fit to print: the database's secrets hidden (see [`crate::secrets`]) and
/// every dangerous character written as `\u{XX}`.
pub fn escape(s: &str) -> Cow<'_, str> {
    match crate::secrets::scrub(s) {
        Cow::Borrowed(b) => escape_controls(b),
        Cow::Owned(o) => Cow::Owned(escape_controls(&o).into_owned()),
    }
}

fn escape_controls(s: &str) -> Cow<'_, str> {
    if !s.chars().any(dangerous) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(
        s.chars()
            .map(|c| {
                if dangerous(c) {
                    format!("\\u{{{:x}}}", c as u32)
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// JSON text with every dangerous character that is still raw (serde_json leaves
/// C1 controls and bidi overrides as they are) written as a `\uXXXX` escape, which
/// keeps the JSON valid and equal in meaning.
pub(crate) fn escape_json(json: &str) -> Cow<'_, str> {
    match crate::secrets::scrub(json) {
        Cow::Borrowed(b) => escape_json_controls(b),
        Cow::Owned(o) => Cow::Owned(escape_json_controls(&o).into_owned()),
    }
}

fn escape_json_controls(json: &str) -> Cow<'_, str> {
    if !json.chars().any(|c| dangerous(c) && c != '\n') {
        return Cow::Borrowed(json);
    }
    Cow::Owned(
        json.chars()
            .map(|c| {
                if dangerous(c) && c != '\n' {
                    format!("\\u{:04x}", c as u32)
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

/// The robot name grammar: 1 to 200 characters, no control characters or
/// bidirectional overrides, no leading or trailing whitespace. Anything else
/// printable (letters of any script, digits, punctuation, inner spaces) is fine.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let n = name.chars().count();
    if n == 0 || n > MAX_NAME_CHARS {
        return Err(format!(
            "a robot name has 1 to {MAX_NAME_CHARS} characters, this one has {n}"
        ));
    }
    if let Some(c) = name.chars().find(|c| dangerous(*c)) {
        return Err(format!(
            "a robot name may not contain control characters or direction overrides; found \\u{{{:x}}} in {}",
            c as u32,
            escape(name)
        ));
    }
    if name.trim() != name {
        return Err(format!(
            "a robot name may not begin or end with whitespace: {:?}",
            escape(name)
        ));
    }
    Ok(())
}

/// A `tracing` writer for stderr that escapes each log record: every dangerous
/// character but the record's final newline, so a robot's name or output can
/// neither inject escape sequences nor forge a second log line.
#[derive(Debug, Clone, Copy, Default)]
pub struct EscapingStderr;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for EscapingStderr {
    type Writer = EscapingStderr;

    fn make_writer(&'a self) -> Self::Writer {
        EscapingStderr
    }
}

impl std::io::Write for EscapingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (body, newline) = match text.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (text.as_ref(), ""),
        };
        let line = format!("{}{newline}", escape(body));
        std::io::stderr().write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_a_terminal_would_execute() {
        assert_eq!(escape("plain name-1"), "plain name-1");
        assert_eq!(escape("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(
            escape("bell\u{7}\r\nforged"),
            "bell\\u{7}\\u{d}\\u{a}forged"
        );
        assert_eq!(escape("csi\u{9b}x"), "csi\\u{9b}x");
        assert_eq!(escape("rtl\u{202e}cod.exe"), "rtl\\u{202e}cod.exe");
        assert_eq!(escape("Ünïcödé 名前"), "Ünïcödé 名前");
    }

    #[test]
    fn json_stays_valid() {
        let raw = serde_json::to_string(&serde_json::json!({"n": "x\u{9b}y\u{1b}"})).unwrap();
        let safe = escape_json(&raw);
        assert!(!safe.contains('\u{9b}') && !safe.contains('\u{1b}'));
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back["n"], "x\u{9b}y\u{1b}");
    }

    #[test]
    fn name_grammar() {
        for ok in ["r1", "counter-7", "Ünïcödé 名前", "a.b_c:d@e/f"] {
            check_name(ok).unwrap();
        }
        let long = "x".repeat(201);
        for bad in [
            "",
            "a\u{1b}[31mred",
            "bell\u{7}",
            "cr\rlf",
            "x\u{202e}y",
            " lead",
            "trail ",
            &long,
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("a\u{1b}b").unwrap_err().contains("\\u{1b}"));
    }
}
