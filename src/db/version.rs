//! MongoDB releases, as slotpool names and compares them, and the oldest it supports.

/// The oldest MongoDB slotpool supports: every command shape it sends is checked
/// against this release and every later one (docs/mongodb.md's audited table).
pub const MINIMUM_VERSION: Version = Version {
    major: 6,
    minor: 0,
    patch: 0,
};

/// A MongoDB release, as `buildInfo` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)?;
        if self.patch > 0 {
            write!(f, ".{}", self.patch)?;
        }
        Ok(())
    }
}

impl Version {
    /// `8.0.4`, `7.0.12-ent`, `6.0.0-rc1`: the leading numbers.
    pub fn parse(text: &str) -> Option<Version> {
        let mut numbers = text.split(['.', '-']).map(|p| p.parse::<u32>().ok());
        Some(Version {
            major: numbers.next()??,
            minor: numbers.next().flatten().unwrap_or(0),
            patch: numbers.next().flatten().unwrap_or(0),
        })
    }

    /// The newest release whose drivers' wire version is at most `wire` (hello's
    /// `maxWireVersion`), for a server whose `buildInfo` did not answer.
    pub(crate) fn from_wire(wire: i64) -> Version {
        let (major, minor) = match wire {
            25.. => (8, 0),
            21.. => (7, 0),
            17.. => (6, 0),
            13.. => (5, 0),
            9.. => (4, 4),
            8 => (4, 2),
            _ => (4, 0),
        };
        Version {
            major,
            minor,
            patch: 0,
        }
    }
}
