//! The worker's two connection pools, and when each opens connections ahead of need.
//!
//! Lease traffic (survey, claim, renew, release, heartbeat) has a pool of its own, so
//! robots' checkpoints never delay a renewal. Connections are opened before the
//! requests that need them, never all at once at a cold start: a standby keeps one
//! open per pool until it first stands at the front of the line, and a holder one
//! lease connection per slot it holds, plus one.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::db::store::Store;
use crate::worker::claim_policy;

/// The lease pool's spare connection: not opened (or its opening failed), ...
const SPARE_NONE: u8 = 0;
/// ... being opened, ...
const SPARE_OPENING: u8 = 1;
/// ... open.
const SPARE_OPEN: u8 = 2;

/// The most connections the lease's own pool opens: renewals of several held slots
/// and the loop's survey, heartbeat or place read may overlap. A standby keeps one
/// open until it first stands at the front, then two (see
/// [`claim_policy::may_claim`]); a holder of `n > 1` slots, `n + 1` (see
/// [`Store::dedicated`]).
const LEASE_POOL: u32 = 4;

/// Connections the robots' pool keeps open once this worker stands at the front of
/// the line: what a watcher's claim sends at once (the claim's event, the server's
/// clock, the slot's robots, the adoption beside the first firing's write), each of
/// which would otherwise cost a handshake first. A worker further back keeps one;
/// it opens the rest when it first moves up.
const ROBOT_POOL_WARM: u32 = 4;

/// The robots' pool (the store the worker was given) and the lease's own, shared by
/// the claim loop and the line keeper.
#[derive(Debug)]
pub(crate) struct Connections {
    robots: Store,
    lease: Store,
    /// Whether `lease` has a client of its own (else it shares `robots`' client,
    /// which is the worker's caller's to close).
    own_lease_client: bool,
    /// Whether the robots' pool was warmed (see [`ROBOT_POOL_WARM`]).
    robots_warmed: AtomicBool,
    /// The lease pool's spare connection: [`SPARE_NONE`], [`SPARE_OPENING`] or
    /// [`SPARE_OPEN`].
    lease_spare: Arc<AtomicU8>,
}

impl Connections {
    /// The lease's pool beside `robots`; when it cannot be made, the lease shares
    /// the robots' pool (said).
    pub(crate) fn new(robots: &Store) -> Connections {
        let (lease, own_lease_client) = match robots.for_leases(LEASE_POOL, 1) {
            Ok(own) => (own, true),
            Err(e) => {
                tracing::warn!(
                    "no dedicated lease connection pool ({e}); sharing the robots' pool"
                );
                (robots.clone(), false)
            }
        };
        Connections {
            robots: robots.clone(),
            lease,
            own_lease_client,
            robots_warmed: AtomicBool::new(false),
            lease_spare: Arc::new(AtomicU8::new(SPARE_NONE)),
        }
    }

    /// The lease's pool.
    pub(crate) fn lease(&self) -> &Store {
        &self.lease
    }

    /// Opens the lease pool's spare connection, in the background, if it is not
    /// open or opening: the first renewals then find a connection ready. A failure
    /// (no answer within [`claim_policy::SETTLE_MOST`]) lets the next call try again.
    pub(crate) fn spare_lease(&self) {
        if self
            .lease_spare
            .compare_exchange(
                SPARE_NONE,
                SPARE_OPENING,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_err()
        {
            return;
        }
        let (store, state) = (self.lease.clone(), self.lease_spare.clone());
        tokio::spawn(async move {
            let opened = store.warm(2, claim_policy::SETTLE_MOST).await;
            if !opened {
                tracing::debug!(
                    "the lease's spare connection did not open; trying again at the next claim"
                );
            }
            state.store(
                if opened { SPARE_OPEN } else { SPARE_NONE },
                Ordering::Release,
            );
        });
    }

    /// This worker first stands at the front of the line (or again, after an
    /// outage replaced the robots' client): the robots' pool opens what a claim
    /// sends at once, and the lease pool its spare, in the background.
    pub(crate) fn at_front(&self, within: Duration) {
        if self.robots_warmed.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = self.robots.clone();
        tokio::spawn(async move { store.warm(ROBOT_POOL_WARM, within).await });
        self.spare_lease();
    }

    /// This worker holds `held` slots now. A second slot's renewals may overlap the
    /// first's: its connection is opened now, not at that moment. The first slot's
    /// renewals have the spare opened in the background since the worker first stood
    /// at the front ([`Connections::at_front`]); pinging the pool here would cost two
    /// requests a claim at a mass failure's busiest moment.
    pub(crate) fn holding(&self, held: usize, within: Duration) {
        if held <= 1 {
            return;
        }
        let open = (held as u32 + 1).min(LEASE_POOL);
        let store = self.lease.clone();
        tokio::spawn(async move { store.warm(open, within).await });
    }

    /// Replaces the robots' client (and with it every connection in its pool) when
    /// an outage began since it was made (`outages` is the worker's count), before a
    /// new slot's robots use it (see [`Store::reopen_after`]): a connection pooled
    /// before the outage may never answer. The lease's client is replaced at a
    /// resume (a holder's renewals would meet such a connection at once); a claim or
    /// heartbeat that meets one is given up at its own bound, which closes the
    /// connection.
    pub(crate) fn reopen_after(&self, outages: u64) {
        match self.robots.reopen_after(outages) {
            Ok(true) => {
                tracing::info!(
                    "the database was out of reach since the robots' connections were opened: opening new ones"
                );
                self.robots_warmed.store(false, Ordering::Release);
            }
            Ok(false) => {}
            Err(e) => tracing::warn!("could not open a new client for the robots: {e}"),
        }
    }

    /// Closes the lease's own client, last, when nothing of the worker's uses it any
    /// more: a client shut down holds no request in flight when the process ends
    /// (see main.rs). The robots' store is the worker's caller's to close.
    pub(crate) async fn close(&self) {
        if self.own_lease_client {
            self.lease.close().await;
        }
    }
}
