//! A held slot's robots while its lease is suspended: past the holder's deadline
//! with no renewal, and not yet given up. An in-process robot (and each run of a
//! scheduled one) is then simply not polled: [`suspendable`] stops driving its
//! future, pending database calls included, until a late renewal proves the epoch
//! and [`Suspension::resume`] lets it go on where it stood. Exec robots are frozen
//! by their shims on the same deadline (see [`crate::robot::shim`]).
//!
//! A suspended robot is never thawed to be stopped: when the lease is given up, its
//! task is aborted (dropped unpolled), and an exec robot's shim, its pipe closed,
//! kills the tree.

use std::future::Future;

use tokio::sync::watch;

/// The held slot's side: suspends and resumes every robot future made
/// [`suspendable`] with one of its [`Suspension::watch`]es.
#[derive(Debug)]
pub(crate) struct Suspension(watch::Sender<bool>);

impl Default for Suspension {
    fn default() -> Self {
        Suspension(watch::Sender::new(false))
    }
}

impl Suspension {
    /// What a robot's future follows.
    pub(crate) fn watch(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }

    /// Stops polling every robot future (true when it was not already).
    pub(crate) fn suspend(&self) -> bool {
        self.0.send_if_modified(|s| !std::mem::replace(s, true))
    }

    /// Polls every robot future again (true when they were suspended).
    pub(crate) fn resume(&self) -> bool {
        self.0.send_if_modified(|s| std::mem::replace(s, false))
    }

    /// Whether the robot futures are suspended now: not polled, so none of them
    /// can see a cancellation either.
    pub(crate) fn is_suspended(&self) -> bool {
        *self.0.borrow()
    }
}

/// `fut`, polled only while `suspended` says false. Once its [`Suspension`] is gone
/// (the held slot ended), it is polled as any future.
pub(crate) async fn suspendable<F: Future>(
    fut: F,
    mut suspended: watch::Receiver<bool>,
) -> F::Output {
    tokio::pin!(fut);
    let mut followed = true;
    loop {
        while followed && *suspended.borrow_and_update() {
            followed = suspended.changed().await.is_ok();
        }
        if !followed {
            return fut.await;
        }
        tokio::select! {
            biased;
            changed = suspended.changed() => followed = changed.is_ok(),
            out = &mut fut => return out,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// A robot that counts a step every 100 ms.
    async fn stepping(steps: Arc<AtomicU32>) {
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            steps.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_suspended_robot_takes_no_step_and_goes_on_when_resumed() {
        let s = Suspension::default();
        let steps = Arc::new(AtomicU32::new(0));
        let task = tokio::spawn(suspendable(stepping(steps.clone()), s.watch()));
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(steps.load(Ordering::SeqCst), 3);
        assert!(s.suspend());
        assert!(!s.suspend(), "already suspended");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(steps.load(Ordering::SeqCst), 3, "no step while suspended");
        assert!(s.resume());
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The step it was waiting for when suspended (its timer long past) comes
        // first, then its pace again.
        assert_eq!(steps.load(Ordering::SeqCst), 4);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(steps.load(Ordering::SeqCst), 5);
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn an_aborted_suspended_robot_never_steps_again() {
        let s = Suspension::default();
        let steps = Arc::new(AtomicU32::new(0));
        let task = tokio::spawn(suspendable(stepping(steps.clone()), s.watch()));
        tokio::time::sleep(Duration::from_millis(150)).await;
        s.suspend();
        tokio::time::sleep(Duration::from_secs(1)).await;
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        s.resume();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(steps.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_future_outliving_its_suspension_runs_on() {
        let s = Suspension::default();
        let rx = s.watch();
        s.suspend();
        drop(s);
        let out = suspendable(async { 7 }, rx).await;
        assert_eq!(out, 7);
    }
}
