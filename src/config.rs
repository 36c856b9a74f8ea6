//! Worker settings and their validation: identity, tick, lease, fence margin, stop grace.
//!
//! Everything here is checked before the worker touches the database, so a bad flag
//! fails in milliseconds with a message that says what to write instead.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

/// Why a setting was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error(
        "invalid address {input:?}: {why} (expected IP:PORT, e.g. 10.0.0.5:7700 or [fd00::5]:7700)"
    )]
    Address { input: String, why: String },
    #[error("invalid duration {input:?}: {why} (expected a positive duration such as 1s, 500ms or 2.5s)")]
    Duration { input: String, why: String },
    #[error("{0}")]
    Timing(String),
}

/// A worker's identity: the `ip:port` it advertises, also the port it serves HTTP on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Identity {
    pub ip: IpAddr,
    pub port: u16,
}

impl Identity {
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.socket_addr())
    }
}

impl FromStr for Identity {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| ConfigError::Address {
            input: s.to_string(),
            why: why.to_string(),
        };
        let addr: SocketAddr = s.trim().parse().map_err(|_| {
            if s.contains(':') {
                bad("not an IP address with a port")
            } else {
                bad("missing :PORT")
            }
        })?;
        if addr.port() == 0 {
            return Err(bad("port 0 is not a real port"));
        }
        if addr.ip().is_unspecified() {
            return Err(bad(
                "advertise an address others can reach, not 0.0.0.0 or ::",
            ));
        }
        Ok(Identity {
            ip: addr.ip(),
            port: addr.port(),
        })
    }
}

/// The longest duration any flag takes: a tick, margin, grace or overflow delay
/// beyond an hour is a typo, and would overflow the lease arithmetic long before
/// it made sense.
pub(crate) const MAX_DURATION: Duration = Duration::from_secs(3600);

/// Parses `1s`, `500ms`, `2.5s`, `1m`; refuses zero, negative values and anything
/// beyond [`MAX_DURATION`].
pub(crate) fn parse_duration(s: &str) -> Result<Duration, ConfigError> {
    let bad = |why: &str| ConfigError::Duration {
        input: s.to_string(),
        why: why.to_string(),
    };
    let t = s.trim();
    if t.starts_with('-') {
        return Err(bad("it is negative"));
    }
    let d = if let Some(secs) = t.strip_suffix('s').filter(|n| n.contains('.')) {
        let v: f64 = secs.parse().map_err(|_| bad("not a number"))?;
        if !v.is_finite() || !(0.0..=1e9).contains(&v) {
            return Err(bad("out of range"));
        }
        Duration::from_secs_f64(v)
    } else {
        humantime::parse_duration(t).map_err(|e| match e {
            humantime::DurationError::NumberOverflow => bad("out of range: use at most 1h"),
            other => bad(&other.to_string()),
        })?
    };
    if d.is_zero() {
        return Err(bad("it must be greater than zero"));
    }
    if d > MAX_DURATION {
        return Err(bad("out of range: use at most 1h"));
    }
    Ok(d)
}

/// The lease's timing: tick `T`, lease `L = 2T`, the self-fence margin and the robots'
/// stop grace.
///
/// The holder stops its robots at `last renew sent + L - margin`; a standby can claim
/// the slot no earlier than `L` after the server applied that renew. So the robots are
/// stopped before anyone else can start them exactly when `grace < margin`. The margin
/// must also be below `T`, or the deadline would fall before the next renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    pub tick: Duration,
    pub margin: Duration,
    pub stop_grace: Duration,
    /// How long past the self-fence deadline a holder keeps its robots suspended
    /// (frozen, not polled) while it tries to renew late; zero stops them at the
    /// deadline. See [`DEFAULT_SUSPEND_FOR`].
    pub suspend_for: Duration,
}

/// `--suspend-for` by default: a minute, so that a replica set's election (about
/// 10–12 s with the default election timeout) or a maintenance step-down is ridden
/// out with every robot resumed in place.
pub const DEFAULT_SUSPEND_FOR: Duration = Duration::from_secs(60);

impl LeaseTiming {
    /// Defaults that scale with the tick: margin 0.45 T, stop grace 0.3 T. A renewal
    /// may then take up to 0.55 T before the holder fences itself.
    pub fn from_tick(tick: Duration) -> Self {
        LeaseTiming {
            tick,
            margin: tick.mul_f64(0.45),
            stop_grace: tick.mul_f64(0.3),
            suspend_for: DEFAULT_SUSPEND_FOR,
        }
    }

    /// How long past the grace the supervisor waits for robot tasks to return before
    /// aborting them: half the room between grace and margin.
    pub fn abort_slack(&self) -> Duration {
        self.margin.saturating_sub(self.stop_grace) / 2
    }

    pub fn lease(&self) -> Duration {
        self.tick * 2
    }

    /// `L - margin`: how long after a renewal was sent the next one may take to come
    /// back before the holder fences itself; on a database that answers one command
    /// at a time, the most any one command of the holder's may keep it busy.
    pub fn renewal_wait(&self) -> Duration {
        self.lease().saturating_sub(self.margin)
    }

    pub fn lease_ms(&self) -> i64 {
        self.lease().as_millis() as i64
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        if self.tick < Duration::from_millis(50) {
            return Err(ConfigError::Timing(format!(
                "tick {} is too short: use at least 50ms (database round trips must fit in it)",
                ms(self.tick)
            )));
        }
        if self.margin >= self.tick {
            return Err(ConfigError::Timing(format!(
                "fence margin {} must be shorter than the tick {}: the holder would fence itself before its next renewal",
                ms(self.margin),
                ms(self.tick)
            )));
        }
        if self.stop_grace >= self.margin {
            return Err(ConfigError::Timing(format!(
                "stop grace {} must be shorter than the fence margin {}: robots must be stopped before the lease can expire and a standby start them again",
                ms(self.stop_grace),
                ms(self.margin)
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_parses_and_refuses() {
        let id: Identity = "10.0.0.5:7700".parse().unwrap();
        assert_eq!(id.to_string(), "10.0.0.5:7700");
        let v6: Identity = "[fd00::5]:7701".parse().unwrap();
        assert_eq!(v6.port, 7701);
        for bad in [
            "10.0.0.5",
            "host:70000",
            "10.0.0.5:0",
            "0.0.0.0:7700",
            "nonsense",
            "",
        ] {
            let e = bad.parse::<Identity>().unwrap_err();
            assert!(e.to_string().contains("expected IP:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s").unwrap(), Duration::from_secs(1));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2.5s").unwrap(), Duration::from_millis(2500));
        for bad in ["0s", "0", "-1s", "fast", "0ms"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_duration("1h").unwrap(), MAX_DURATION);
        for huge in ["9999999999999999999s", "100000000000s", "61m", "3600.5s"] {
            let e = parse_duration(huge).unwrap_err().to_string();
            assert!(e.contains("at most 1h"), "{huge}: {e}");
        }
    }

    #[test]
    fn timing_rules() {
        let t = LeaseTiming::from_tick(Duration::from_secs(1));
        assert_eq!(t.lease(), Duration::from_secs(2));
        t.validate().unwrap();
        let grace_too_long = LeaseTiming {
            stop_grace: Duration::from_millis(450),
            ..t
        };
        assert!(grace_too_long
            .validate()
            .unwrap_err()
            .to_string()
            .contains("stop grace"));
        let margin_too_long = LeaseTiming {
            margin: Duration::from_secs(1),
            ..t
        };
        assert!(margin_too_long.validate().is_err());
        assert!(LeaseTiming::from_tick(Duration::from_millis(10))
            .validate()
            .is_err());
    }
}
