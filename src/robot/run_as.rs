//! `--exec-user`: the user `exec` robots run as, when it is not the worker's own.
//!
//! A robot running as the worker's user can signal, trace or freeze its guards (stop
//! its shim, then the worker, and nothing ends it at the lease's end). Under another
//! user without capabilities the kernel refuses all of that. The worker needs root
//! (or `CAP_SETUID` and `CAP_SETGID`); the shim switches user in the robot's process,
//! after joining its cgroup and setting rlimits, with no supplementary groups.

use std::ffi::CString;

/// A resolved user: the ids the robot runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunAs {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

impl RunAs {
    /// `USER`, `USER:GROUP`, `UID` or `UID:GID`; a user without a group runs with
    /// its own primary group. Names are looked up on this machine.
    pub(crate) fn parse(spec: &str) -> Result<RunAs, String> {
        let shown = crate::printable::escape(spec);
        let (user, group) = match spec.split_once(':') {
            Some((u, g)) => (u, Some(g)),
            None => (spec, None),
        };
        if user.is_empty() || group.is_some_and(str::is_empty) {
            return Err(format!(
                "--exec-user {shown}: give USER, USER:GROUP, UID or UID:GID"
            ));
        }
        let (uid, primary) = match user.parse::<u32>() {
            Ok(uid) => (uid, lookup_user_by_id(uid)),
            Err(_) => lookup_user(user)
                .map(|(u, g)| (u, Some(g)))
                .ok_or_else(|| format!("--exec-user {shown}: no user {user:?} on this machine"))?,
        };
        let gid = match group {
            Some(g) => match g.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => lookup_group(g)
                    .ok_or_else(|| format!("--exec-user {shown}: no group {g:?} on this machine"))?,
            },
            None => primary.ok_or_else(|| {
                format!("--exec-user {shown}: user id {uid} has no entry on this machine; give its group too (UID:GID)")
            })?,
        };
        // SAFETY: geteuid has no preconditions.
        let worker = unsafe { libc::geteuid() };
        if uid == 0 || uid == worker {
            return Err(format!(
                "--exec-user {shown}: {} is this worker's own user, which robots must not share with it; name another",
                if uid == 0 { "root" } else { "that" }
            ));
        }
        Ok(RunAs { uid, gid })
    }

    /// Whether this process may switch a child to another user.
    pub(crate) fn may_switch() -> bool {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            return true;
        }
        has_capability(CAP_SETUID) && has_capability(CAP_SETGID)
    }

    /// The shim's argument: `UID:GID`, or `-` for the worker's own user.
    pub(crate) fn to_arg(run_as: Option<RunAs>) -> String {
        run_as.map_or_else(|| "-".into(), |r| format!("{}:{}", r.uid, r.gid))
    }

    pub(crate) fn from_arg(arg: &str) -> Result<Option<RunAs>, String> {
        if arg == "-" {
            return Ok(None);
        }
        let (u, g) = arg.split_once(':').ok_or("bad user argument")?;
        Ok(Some(RunAs {
            uid: u.parse().map_err(|_| "bad uid")?,
            gid: g.parse().map_err(|_| "bad gid")?,
        }))
    }

    /// Drops every supplementary group, then the group, then the user. Runs between
    /// fork and exec: raw syscalls only.
    pub(crate) fn apply_in_child(&self) -> std::io::Result<()> {
        // SAFETY: setgroups, setgid and setuid take plain integers (and no list).
        unsafe {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(self.gid) != 0
                || libc::setuid(self.uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;

/// Whether `cap` is in this process's effective set.
fn has_capability(cap: u32) -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget with properly sized, initialised structs.
    let ok = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) } == 0;
    ok && data[(cap / 32) as usize].effective & (1 << (cap % 32)) != 0
}

fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let name = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: getpwnam_r writes into the passwd and buffer we own.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out = std::ptr::null_mut();
        let rc = libc::getpwnam_r(
            name.as_ptr(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        );
        (rc == 0 && !out.is_null()).then_some((pw.pw_uid, pw.pw_gid))
    }
}

fn lookup_user_by_id(uid: u32) -> Option<u32> {
    account_by_id(uid).map(|(_, gid)| gid)
}

/// The name of the account with user id `uid`, from the system's user database.
pub(crate) fn user_name(uid: u32) -> Option<String> {
    account_by_id(uid).map(|(name, _)| name)
}

/// The account with user id `uid`: its name and primary group.
fn account_by_id(uid: u32) -> Option<(String, u32)> {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: getpwuid_r writes into the passwd and buffer we own; pw_name points
    // into that buffer, which outlives the copy made of it.
    unsafe {
        let mut pw: libc::passwd = std::mem::zeroed();
        let mut out = std::ptr::null_mut();
        let rc = libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out);
        if rc != 0 || out.is_null() || pw.pw_name.is_null() {
            return None;
        }
        let name = std::ffi::CStr::from_ptr(pw.pw_name)
            .to_string_lossy()
            .into_owned();
        Some((name, pw.pw_gid))
    }
}

fn lookup_group(name: &str) -> Option<u32> {
    let name = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: getgrnam_r writes into the group and buffer we own.
    unsafe {
        let mut gr: libc::group = std::mem::zeroed();
        let mut out = std::ptr::null_mut();
        let rc = libc::getgrnam_r(
            name.as_ptr(),
            &mut gr,
            buf.as_mut_ptr(),
            buf.len(),
            &mut out,
        );
        (rc == 0 && !out.is_null()).then_some(gr.gr_gid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_by_name_or_number_and_refusals() {
        let nobody = RunAs::parse("nobody").unwrap();
        assert_ne!(nobody.uid, 0);
        assert_eq!(
            RunAs::parse("65534:65534").unwrap(),
            RunAs {
                uid: 65534,
                gid: 65534
            }
        );
        assert_eq!(
            RunAs::parse("4242:4242").unwrap(),
            RunAs {
                uid: 4242,
                gid: 4242
            }
        );
        for (bad, why) in [
            ("root", "must not share"),
            ("0:0", "must not share"),
            ("no-such-user-here", "no user"),
            ("nobody:no-such-group-here", "no group"),
            ("4242", "give its group too"),
            (":1", "give USER"),
            ("nobody:", "give USER"),
        ] {
            let e = RunAs::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_shim_argument_round_trips() {
        for r in [
            None,
            Some(RunAs {
                uid: 1000,
                gid: 100,
            }),
        ] {
            assert_eq!(RunAs::from_arg(&RunAs::to_arg(r)).unwrap(), r);
        }
        assert!(RunAs::from_arg("x").is_err());
    }
}
