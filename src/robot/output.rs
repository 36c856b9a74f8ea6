//! A robot's output, bounded: no line, and no flood of lines, can exhaust the
//! worker's memory or disk.
//!
//! [`BoundedLines`] keeps at most `max` bytes of a line and skips the rest; a
//! [`LogBudget`] admits [`LOG_LINES_PER_SEC`] lines a second (bursts of [`LOG_BURST`])
//! and reports what it dropped at most every [`DROP_REPORT_EVERY`]; [`shown`] cuts a
//! logged line to [`LOGGED_LINE_BYTES`]. Checkpoint lines are never dropped by the
//! budget, and one longer than the stdout bound is refused as a checkpoint.

use std::time::{Duration, Instant};

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// The longest stdout line kept whole, in bytes: room for a checkpoint of the
/// largest context ([`crate::db::context::MAX_CONTEXT_BYTES`]) written as JSON.
pub(crate) const MAX_STDOUT_LINE: usize = 4 * 1024 * 1024;

/// The longest stderr line kept, in bytes (stderr is only ever logged).
pub(crate) const MAX_STDERR_LINE: usize = 64 * 1024;

/// How much of a line a log record shows.
pub(crate) const LOGGED_LINE_BYTES: usize = 4096;

/// Log lines a robot may write per second, on average.
pub(crate) const LOG_LINES_PER_SEC: f64 = 100.0;

/// Log lines a robot may write at once after a quiet spell.
pub(crate) const LOG_BURST: f64 = 1000.0;

/// After this many lines dropped in a row, reading pauses for [`THROTTLE_PAUSE`]:
/// a robot writing millions of lines a second is slowed to about 100,000 (its
/// writes block meanwhile) instead of costing the worker a whole core.
pub(crate) const THROTTLE_EVERY: u64 = 1000;

/// See [`THROTTLE_EVERY`].
pub(crate) const THROTTLE_PAUSE: Duration = Duration::from_millis(10);

/// How often a flooding robot's dropped lines are reported, after the first time.
pub(crate) const DROP_REPORT_EVERY: Duration = Duration::from_secs(10);

/// One line as read: its first bytes (lossy UTF-8, without the newline) and how
/// many bytes past the bound were skipped.
#[derive(Debug, PartialEq)]
pub(crate) struct RawLine {
    pub(crate) text: String,
    pub(crate) cut: usize,
}

/// Reads lines of at most `max` bytes from `reader`.
pub(crate) struct BoundedLines<R> {
    reader: R,
    max: usize,
    buf: Vec<u8>,
}

impl<R: AsyncBufRead + Unpin> BoundedLines<R> {
    pub(crate) fn new(reader: R, max: usize) -> Self {
        BoundedLines {
            reader,
            max,
            buf: Vec::new(),
        }
    }

    /// The next line; `None` at the end of the stream. A last line without a
    /// newline is still a line.
    pub(crate) async fn next_line(&mut self) -> std::io::Result<Option<RawLine>> {
        self.buf.clear();
        let mut cut = 0usize;
        let mut any = false;
        loop {
            let chunk = self.reader.fill_buf().await?;
            if chunk.is_empty() {
                break;
            }
            any = true;
            let (part, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (&chunk[..i], Some(i + 1)),
                None => (chunk, None),
            };
            let room = self.max.saturating_sub(self.buf.len());
            let keep = part.len().min(room);
            self.buf.extend_from_slice(&part[..keep]);
            cut += part.len() - keep;
            let used = done.unwrap_or(chunk.len());
            self.reader.consume(used);
            if done.is_some() {
                return Ok(Some(self.take(cut)));
            }
        }
        Ok(any.then(|| self.take(cut)))
    }

    fn take(&mut self, cut: usize) -> RawLine {
        if self.buf.last() == Some(&b'\r') {
            self.buf.pop();
        }
        let text = String::from_utf8_lossy(&self.buf).into_owned();
        self.buf = Vec::new();
        RawLine { text, cut }
    }
}

/// `text` cut to [`LOGGED_LINE_BYTES`] (at a character boundary), with a marker
/// saying how much is not shown (`cut` bytes were skipped while reading).
pub(crate) fn shown(text: &str, cut: usize) -> String {
    if text.len() <= LOGGED_LINE_BYTES && cut == 0 {
        return text.to_string();
    }
    let mut end = text.len().min(LOGGED_LINE_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let hidden = text.len() - end + cut;
    format!("{}… [line cut: {hidden} more bytes]", &text[..end])
}

/// A token bucket of log lines: `rate` a second, up to `burst` at once.
#[derive(Debug)]
pub(crate) struct LogBudget {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
    dropped: u64,
    reported: Option<Instant>,
    /// Lines dropped since the last one logged.
    in_a_row: u64,
}

impl LogBudget {
    pub(crate) fn new(now: Instant) -> Self {
        Self::with(LOG_LINES_PER_SEC, LOG_BURST, now)
    }

    pub(crate) fn with(rate: f64, burst: f64, now: Instant) -> Self {
        LogBudget {
            rate,
            burst,
            tokens: burst,
            at: now,
            dropped: 0,
            reported: None,
            in_a_row: 0,
        }
    }

    /// Whether one more line may be logged at `now`. When it may, also returns how
    /// many lines were dropped since the last report, when one is due (log that
    /// first).
    pub(crate) fn admit(&mut self, now: Instant) -> Admit {
        let elapsed = now.saturating_duration_since(self.at);
        self.at = now;
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            let due = self
                .reported
                .is_none_or(|at| now.saturating_duration_since(at) >= DROP_REPORT_EVERY);
            let dropped_before = if self.dropped > 0 && due {
                self.reported = Some(now);
                std::mem::take(&mut self.dropped)
            } else {
                0
            };
            self.in_a_row = 0;
            Admit::Log { dropped_before }
        } else {
            self.dropped += 1;
            self.in_a_row += 1;
            Admit::Drop {
                pause: self
                    .in_a_row
                    .is_multiple_of(THROTTLE_EVERY)
                    .then_some(THROTTLE_PAUSE),
            }
        }
    }

    /// Lines dropped and not yet reported (report them when the robot ends).
    pub(crate) fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }

    /// How long until one more line may be logged.
    #[cfg(test)]
    pub(crate) fn refill_in(&self) -> Duration {
        Duration::from_secs_f64(((1.0 - self.tokens).max(0.0)) / self.rate)
    }
}

#[derive(Debug, PartialEq)]
pub(crate) enum Admit {
    Log {
        dropped_before: u64,
    },
    /// Not logged; when `pause` is set, read nothing more for that long.
    Drop {
        pause: Option<Duration>,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], max: usize) -> Vec<RawLine> {
        let reader = tokio::io::BufReader::with_capacity(4, input);
        let mut l = BoundedLines::new(reader, max);
        let mut out = Vec::new();
        while let Some(line) = l.next_line().await.unwrap() {
            out.push(line);
        }
        out
    }

    fn line(text: &str, cut: usize) -> RawLine {
        RawLine {
            text: text.into(),
            cut,
        }
    }

    #[tokio::test]
    async fn keeps_short_lines_whole_and_cuts_long_ones() {
        assert_eq!(
            lines(b"ab\r\ncdefghij\nk", 5).await,
            vec![line("ab", 0), line("cdefg", 3), line("k", 0)]
        );
        assert_eq!(lines(b"", 5).await, vec![]);
        assert_eq!(lines(b"\n\n", 5).await, vec![line("", 0), line("", 0)]);
    }

    #[tokio::test]
    async fn a_line_without_end_costs_no_more_than_the_bound() {
        let big = vec![b'x'; 1 << 20];
        let got = lines(&big, 1000).await;
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].text.len(), 1000);
        assert_eq!(got[0].cut, (1 << 20) - 1000);
    }

    #[test]
    fn shows_the_start_and_says_how_much_is_cut() {
        assert_eq!(shown("short", 0), "short");
        let long = "é".repeat(LOGGED_LINE_BYTES);
        let s = shown(&long, 10);
        assert!(s.starts_with("éé") && s.ends_with("more bytes]"), "{s}");
        assert!(s.len() < LOGGED_LINE_BYTES + 40);
        assert_eq!(shown("abc", 7), "abc… [line cut: 7 more bytes]");
    }

    #[test]
    fn a_flood_is_throttled_every_thousand_drops() {
        let t0 = Instant::now();
        let mut b = LogBudget::with(10.0, 1.0, t0);
        assert!(matches!(b.admit(t0), Admit::Log { .. }));
        let pauses = (0..3000)
            .filter(|_| matches!(b.admit(t0), Admit::Drop { pause: Some(_) }))
            .count();
        assert_eq!(pauses, 3);
    }

    #[test]
    fn budget_admits_a_burst_then_the_rate_and_reports_drops() {
        let t0 = Instant::now();
        let mut b = LogBudget::with(10.0, 3.0, t0);
        for _ in 0..3 {
            assert_eq!(b.admit(t0), Admit::Log { dropped_before: 0 });
        }
        assert_eq!(b.admit(t0), Admit::Drop { pause: None });
        assert_eq!(b.admit(t0), Admit::Drop { pause: None });
        assert!(b.refill_in() <= Duration::from_millis(100));
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(b.admit(t1), Admit::Log { dropped_before: 2 });
        assert_eq!(b.admit(t1), Admit::Drop { pause: None });
        // The next report waits its turn; the count keeps growing meanwhile.
        let t15 = t1 + Duration::from_millis(100);
        assert_eq!(b.admit(t15), Admit::Log { dropped_before: 0 });
        assert_eq!(b.admit(t15), Admit::Drop { pause: None });
        assert_eq!(b.take_dropped(), 2);
        // A long quiet spell refills only up to the burst.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert!(matches!(b.admit(t2), Admit::Log { .. }));
        }
        assert_eq!(b.admit(t2), Admit::Drop { pause: None });
    }
}
