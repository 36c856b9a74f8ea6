//! The deployment behind a connection, as `hello` and `buildInfo` describe it: the
//! server's version, and whether it is a replica set, a standalone server or a
//! `mongos`; and what slotpool requires of it (docs/mongodb.md).

use bson::{doc, Bson, Document};

use crate::db::store::{Store, StoreError};

pub use crate::db::version::{Version, MINIMUM_VERSION};

/// What kind of deployment answers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topology {
    /// The replica set's name; None for a standalone server (or a `mongos`).
    pub set_name: Option<String>,
    /// The data-bearing members `hello` lists: `hosts` and the priority-0 `passives`.
    /// Hidden members are listed nowhere, so they are not counted.
    pub data_bearing: usize,
    pub arbiters: usize,
    /// A `mongos` of a sharded cluster.
    pub router: bool,
}

impl Topology {
    pub(crate) fn from_hello(hello: &Document) -> Topology {
        let count = |key: &str| hello.get_array(key).map_or(0, |a| a.len());
        Topology {
            set_name: hello.get_str("setName").ok().map(str::to_string),
            data_bearing: count("hosts") + count("passives"),
            arbiters: count("arbiters"),
            router: hello.get_str("msg") == Ok("isdbgrid"),
        }
    }

    /// How many data-bearing members must acknowledge a majority write when every
    /// member listed votes: a majority of all voters, arbiters included, and only
    /// data-bearing members acknowledge writes.
    pub fn majority(&self) -> usize {
        (self.data_bearing + self.arbiters) / 2 + 1
    }

    /// What an operator should know of this deployment for the lease: said once at
    /// a worker's start.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.set_name.is_none() && !self.router {
            out.push(
                "the database is a standalone server, not a replica set: no failover is \
                 possible, and while it is down every holder suspends its robots"
                    .to_string(),
            );
        }
        if self.arbiters > 0 {
            let needed = self.majority();
            let spare = self.data_bearing.saturating_sub(needed);
            let down = match spare {
                0 => "with any one of them down".to_string(),
                n => format!("with more than {n} of them down"),
            };
            out.push(format!(
                "the replica set has {} arbiter(s) beside {} data-bearing member(s) that \
                 hello lists: a majority write needs {needed} of the data-bearing members \
                 (arbiters vote but acknowledge no write), so {down} renewals wait, and \
                 holders suspend their robots until enough are back",
                self.arbiters, self.data_bearing
            ));
        }
        out
    }
}

/// The server behind a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    /// Its release (from `buildInfo`, else from `hello`'s wire version).
    pub version: Version,
    pub topology: Topology,
}

/// Why slotpool will not run against a deployment.
#[derive(Debug, thiserror::Error)]
pub enum DeploymentError {
    #[error(
        "the server is MongoDB {found}, and slotpool needs {MINIMUM_VERSION} or later: \
         commands it sends are refused by older servers (docs/mongodb.md lists each \
         command and the release it needs). Upgrade the server"
    )]
    TooOld { found: Version },
    #[error(
        "the server is a mongos of a sharded cluster. Each mongos evaluates $$NOW, the \
         clock every lease is judged by, with its own host's clock, so a worker whose \
         mongos runs ahead can claim a slot whose holder still runs. Run workers \
         against one mongos, or keep every mongos host's clock in step (NTP, well \
         within --fence-margin) and say so with --mongos-clocks-agree \
         (docs/mongodb.md, 'Behind mongos')"
    )]
    Router,
}

impl Deployment {
    /// Refuses a server older than [`MINIMUM_VERSION`].
    pub fn supported(&self) -> Result<(), DeploymentError> {
        if self.version < MINIMUM_VERSION {
            return Err(DeploymentError::TooOld {
                found: self.version,
            });
        }
        Ok(())
    }

    /// Refuses what a worker cannot hold leases on: an unsupported server, and a
    /// `mongos` unless the operator says its clocks agree.
    pub fn holds_leases(&self, mongos_clocks_agree: bool) -> Result<(), DeploymentError> {
        self.supported()?;
        if self.topology.router && !mongos_clocks_agree {
            return Err(DeploymentError::Router);
        }
        Ok(())
    }

    pub(crate) fn from_replies(hello: &Document, build_info: Option<&Document>) -> Deployment {
        let from_build = build_info.and_then(|b| {
            let array = b.get_array("versionArray").ok().and_then(|a| {
                let n = |i: usize| match a.get(i) {
                    Some(Bson::Int32(v)) => u32::try_from(*v).ok(),
                    Some(Bson::Int64(v)) => u32::try_from(*v).ok(),
                    _ => None,
                };
                Some(Version {
                    major: n(0)?,
                    minor: n(1).unwrap_or(0),
                    patch: n(2).unwrap_or(0),
                })
            });
            array.or_else(|| Version::parse(b.get_str("version").ok()?))
        });
        let wire = match hello.get("maxWireVersion") {
            Some(Bson::Int32(v)) => i64::from(*v),
            Some(Bson::Int64(v)) => *v,
            _ => 0,
        };
        Deployment {
            version: from_build.unwrap_or_else(|| Version::from_wire(wire)),
            topology: Topology::from_hello(hello),
        }
    }
}

impl Store {
    /// What the server says of itself (`hello`, and `buildInfo`, which needs no
    /// privilege).
    pub async fn deployment(&self) -> Result<Deployment, StoreError> {
        let db = self.db();
        let hello = db.run_command(doc! {"hello": 1}).await?;
        let build_info = db.run_command(doc! {"buildInfo": 1}).await.ok();
        Ok(Deployment::from_replies(&hello, build_info.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_read_as_the_server_writes_them() {
        let v = |s| Version::parse(s).unwrap();
        assert_eq!(
            v("8.0.4"),
            Version {
                major: 8,
                minor: 0,
                patch: 4
            }
        );
        assert_eq!(
            v("7.0.12-ent"),
            Version {
                major: 7,
                minor: 0,
                patch: 12
            }
        );
        assert_eq!(v("6.0.0-rc1"), MINIMUM_VERSION);
        assert!(v("5.0.26") < MINIMUM_VERSION);
        assert!(v("6.0.1") > MINIMUM_VERSION);
        assert_eq!(Version::parse("x"), None);
        assert_eq!(v("8.2.11").to_string(), "8.2.11");
        assert_eq!(MINIMUM_VERSION.to_string(), "6.0");
    }

    #[test]
    fn the_version_comes_from_build_info_else_from_the_wire_version() {
        let hello = doc! {"maxWireVersion": 21};
        let built = doc! {"version": "8.0.3", "versionArray": [8, 0, 3, 0]};
        let d = Deployment::from_replies(&hello, Some(&built));
        assert_eq!(
            d.version,
            Version {
                major: 8,
                minor: 0,
                patch: 3
            }
        );
        let d = Deployment::from_replies(&hello, None);
        assert_eq!(
            d.version,
            Version {
                major: 7,
                minor: 0,
                patch: 0
            }
        );
        let old = Deployment::from_replies(&doc! {"maxWireVersion": 13}, None);
        assert!(matches!(
            old.supported(),
            Err(DeploymentError::TooOld { .. })
        ));
        let text = old.supported().unwrap_err().to_string();
        assert!(
            text.contains("MongoDB 5.0") && text.contains("6.0 or later"),
            "{text}"
        );
    }

    #[test]
    fn a_mongos_holds_leases_only_when_its_clocks_are_said_to_agree() {
        let router =
            Deployment::from_replies(&doc! {"msg": "isdbgrid", "maxWireVersion": 25}, None);
        assert!(router.supported().is_ok());
        assert!(matches!(
            router.holds_leases(false),
            Err(DeploymentError::Router)
        ));
        assert!(router.holds_leases(true).is_ok());
        assert!(router.topology.warnings().is_empty());
    }

    #[test]
    fn a_standalone_server_and_an_arbiter_are_warned_about() {
        let standalone = Topology::from_hello(&doc! {"isWritablePrimary": true});
        assert_eq!(standalone.warnings().len(), 1);
        assert!(standalone.warnings()[0].contains("standalone"));
        let pss = Topology::from_hello(&doc! {
            "setName": "rs0", "hosts": ["a:27017", "b:27017", "c:27017"],
        });
        assert!(pss.warnings().is_empty());
    }

    #[test]
    fn in_a_primary_secondary_arbiter_set_a_majority_write_needs_both_data_bearing_members() {
        let psa = Topology::from_hello(&doc! {
            "setName": "rs0", "hosts": ["a:27017", "b:27017"], "arbiters": ["c:27017"],
        });
        assert_eq!((psa.data_bearing, psa.arbiters, psa.majority()), (2, 1, 2));
        let w = psa.warnings();
        assert_eq!(w.len(), 1);
        assert!(
            w[0].contains("needs 2 of the data-bearing") && w[0].contains("any one of them down"),
            "{}",
            w[0]
        );
        // Five data-bearing (one of them priority 0, listed as passive) and an
        // arbiter: four of five must acknowledge, one may be down.
        let p4a = Topology::from_hello(&doc! {
            "setName": "rs0", "hosts": ["a", "b", "c", "d"], "passives": ["e"], "arbiters": ["f"],
        });
        assert_eq!((p4a.data_bearing, p4a.majority()), (5, 4));
        assert!(p4a.warnings()[0].contains("more than 1 of them down"));
    }
}
