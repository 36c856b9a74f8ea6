//! What an `exec` robot may do on this worker: which commands it may run
//! (`--exec-allow`) and which environment variables its spec may set
//! (`--exec-env-allow`). Pure decisions, unit-tested.
//!
//! A spec is hostile input (anyone who can write to the database writes it), so with
//! no `--exec-allow` no `exec` robot runs, and variables that change how programs load
//! or interpret code (`LD_PRELOAD`, `BASH_ENV`, `PATH`, …) are always refused
//! ([`loads_code`]). The environment is built from scratch: [`INHERITED`] (never the
//! credentials), then the spec's allowed variables, then `SLOTPOOL_*`.

use super::limits::{Limits, Via};

/// Variables of the worker's own environment an `exec` robot inherits; nothing
/// else of it (no `MONGODB_URI`, no cloud credentials, no `SLOTPOOL_*` settings).
pub(crate) const INHERITED: &[&str] = &["PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR"];

/// The longest value a spec may give one variable, in bytes (Linux refuses a single
/// environment string over 128 KiB at exec).
pub(crate) const MAX_ENV_VALUE: usize = 32 * 1024;

/// Exact names (compared ignoring case) that make a program load or run other code,
/// or look for its start-up files elsewhere.
const CODE_LOADING: &[&str] = &[
    "PATH",
    "ENV",
    "BASH_ENV",
    "BASHOPTS",
    "SHELLOPTS",
    "IFS",
    "CDPATH",
    "GLOBIGNORE",
    "PROMPT_COMMAND",
    "PS1",
    "PS2",
    "PS3",
    "PS4",
    "HOME",
    "ZDOTDIR",
    "INPUTRC",
    "CLASSPATH",
    "GCONV_PATH",
    "GLIBC_TUNABLES",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "RESOLV_HOST_CONF",
    "TZDIR",
    "EDITOR",
    "VISUAL",
    "PAGER",
    "BROWSER",
    "LESSOPEN",
    "LESSCLOSE",
    "SSH_ASKPASS",
    "SUDO_ASKPASS",
    "RUBYOPT",
    "RUBYLIB",
    "PERLLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
];

/// Name prefixes (compared ignoring case) of the same kind: bash exported
/// functions, the dynamic loader, interpreters' option and library paths.
const CODE_LOADING_PREFIXES: &[&str] = &[
    "BASH_FUNC_",
    "LD_",
    "DYLD_",
    "PYTHON",
    "PERL",
    "NODE_",
    "NPM_CONFIG_",
    "RUBY",
    "GEM_",
    "LUA_",
    "JAVA",
    "OPENSSL_",
    "TERMINFO",
    "XDG_",
    "GIT_",
    "MALLOC_",
];

/// Whether setting `name` can make a program load or interpret code it was not
/// given: such a name is refused even when an allow-list entry matches it.
pub(crate) fn loads_code(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    CODE_LOADING.contains(&upper.as_str())
        || CODE_LOADING_PREFIXES.iter().any(|p| upper.starts_with(p))
}

/// Checks one variable of `spec.env` against what no worker allows: a name that is
/// not `[A-Za-z_][A-Za-z0-9_]*`, a name in `SLOTPOOL_*` (the worker sets those), a
/// name that [`loads_code`], a value with a NUL byte or over [`MAX_ENV_VALUE`].
pub(crate) fn check_variable(name: &str, value: &str) -> Result<(), String> {
    let shown = crate::printable::escape(name);
    if loads_code(name) {
        return Err(format!(
            "spec.env: {shown} is refused: it changes how programs load or interpret code \
             (refused: PATH, HOME, ENV, BASH_ENV, BASH_FUNC_*, LD_*, PYTHON*, NODE_*, and their kind)"
        ));
    }
    let mut chars = name.chars();
    let well_formed = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !well_formed {
        return Err(format!(
            "spec.env: {shown:?} is not a variable name (letters, digits and _, not starting with a digit)"
        ));
    }
    if name.to_ascii_uppercase().starts_with("SLOTPOOL_") {
        return Err(format!(
            "spec.env: {shown} is reserved: the worker sets SLOTPOOL_* variables itself"
        ));
    }
    if value.contains('\0') {
        return Err(format!("spec.env.{shown} holds a NUL byte"));
    }
    if value.len() > MAX_ENV_VALUE {
        return Err(format!(
            "spec.env.{shown} is {} bytes; a value may have at most {MAX_ENV_VALUE}",
            value.len()
        ));
    }
    Ok(())
}

/// What `exec` robots may do on one worker.
#[derive(Debug, Clone, Default)]
pub struct ExecPolicy {
    /// Entries ending in `/` allow every command under that directory; any other
    /// entry allows exactly that command string. Empty: no `exec` robot runs.
    commands: Vec<String>,
    /// Names a spec may set; an entry ending in `*` allows every name with that
    /// prefix. Names that [`loads_code`] stay refused.
    env: Vec<String>,
    /// The limits of a robot whose spec names none (field by field).
    default_limits: Limits,
    /// How the shim applies limits.
    limits_via: Via,
    /// The user robots run as (`--exec-user`); None: the worker's own.
    run_as: Option<super::run_as::RunAs>,
}

impl ExecPolicy {
    /// No `exec` robot runs (the default).
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Robots may run these commands, with no variables of their own. Refuses an
    /// entry that is a relative path (`bin/run.sh`, `./robots/`): it would be
    /// resolved against whatever directory the worker was started in, so the same
    /// flag would allow different programs on different hosts. A bare name
    /// (`python3`) is looked up in `PATH`, as the spec's command is.
    pub fn commands(entries: Vec<String>) -> Result<Self, String> {
        let mut commands = Vec::new();
        for entry in entries.into_iter().filter(|e| !e.is_empty()) {
            let shown = crate::printable::escape(&entry);
            if entry.contains('/') && !entry.starts_with('/') {
                return Err(format!(
                    "--exec-allow {shown}: a relative path would be resolved against the \
                     worker's working directory; give an absolute path (/opt/robots/ or \
                     /usr/bin/python3), or a bare command name looked up in PATH"
                ));
            }
            if entry.split('/').any(|part| part == ".." || part == ".") {
                return Err(format!(
                    "--exec-allow {shown}: \".\" and \"..\" are refused in an allowed path; \
                     give the directory or command as it is"
                ));
            }
            commands.push(entry);
        }
        Ok(ExecPolicy {
            commands,
            ..Default::default()
        })
    }

    /// Bounds robots whose spec leaves a limit unset by `default`, and applies
    /// limits the way `via` says (`--exec-default-limits`, `--exec-limits-via`).
    pub(crate) fn with_limits(mut self, default: Limits, via: Via) -> Self {
        self.default_limits = default;
        self.limits_via = via;
        self
    }

    /// Runs robots as this user (`--exec-user`) rather than the worker's own.
    pub(crate) fn with_user(mut self, run_as: Option<super::run_as::RunAs>) -> Self {
        self.run_as = run_as;
        self
    }

    /// The user robots run as; None: the worker's own.
    pub(crate) fn run_as(&self) -> Option<super::run_as::RunAs> {
        self.run_as
    }

    /// The limits a robot with `own` limits runs under, and how they are applied.
    pub(crate) fn limits_for(&self, own: Limits) -> (Limits, Via) {
        (own.or(self.default_limits), self.limits_via)
    }

    /// For the worker's start line: `memory 512.0 MB via auto`.
    pub(crate) fn describe_limits(&self) -> String {
        format!(
            "{} via {}",
            self.default_limits.describe(),
            self.limits_via.as_str()
        )
    }

    /// Also lets specs set these variables. Refuses an entry that names a variable
    /// no robot may set, so an operator learns at start, not from a failed robot.
    pub fn with_env(mut self, entries: Vec<String>) -> Result<Self, String> {
        for entry in entries.iter().filter(|e| !e.is_empty()) {
            let refused = match entry.strip_suffix('*') {
                None => check_variable(entry, "").err(),
                Some("") => None,
                // A prefix is checked as the shortest name it admits would be.
                Some(prefix) => check_variable(prefix, "").err(),
            };
            if let Some(why) = refused {
                return Err(format!(
                    "--exec-env-allow {}: {}",
                    crate::printable::escape(entry),
                    why.trim_start_matches("spec.env: ")
                ));
            }
            self.env.push(entry.clone());
        }
        Ok(self)
    }

    #[cfg(test)]
    pub(crate) fn enabled(&self) -> bool {
        !self.commands.is_empty()
    }

    /// Whether `command` may run; the error says why not and what to change.
    pub(crate) fn check_command(&self, command: &str) -> Result<(), String> {
        if self.commands.is_empty() {
            return Err(
                "exec robots are disabled on this worker: start it with --exec-allow DIR/ \
                 (or --exec-allow /path/to/command) to run them"
                    .into(),
            );
        }
        let no_escape = !command.split('/').any(|part| part == "..");
        let allowed = self.commands.iter().any(|entry| {
            if entry.ends_with('/') {
                no_escape && command.starts_with(entry.as_str())
            } else {
                entry == command
            }
        });
        if allowed {
            Ok(())
        } else {
            Err(format!(
                "command {:?} is not allowed by this worker's --exec-allow ({})",
                crate::printable::escape(command),
                self.commands.join(", ")
            ))
        }
    }

    /// Whether the spec may set every one of `env`; the error names the first
    /// variable refused and how an operator would allow it.
    pub(crate) fn check_env(&self, env: &[(String, String)]) -> Result<(), String> {
        for (name, value) in env {
            check_variable(name, value)?;
            let allowed = self.env.iter().any(|entry| match entry.strip_suffix('*') {
                Some(prefix) => name.starts_with(prefix),
                None => entry == name,
            });
            if !allowed {
                return Err(format!(
                    "spec.env sets {}, which this worker does not allow ({}); \
                     an operator allows it with --exec-env-allow {}",
                    crate::printable::escape(name),
                    self.describe_env(),
                    crate::printable::escape(name)
                ));
            }
        }
        Ok(())
    }

    pub(crate) fn describe(&self) -> String {
        if self.commands.is_empty() {
            "none (exec robots disabled)".into()
        } else {
            self.commands.join(", ")
        }
    }

    pub(crate) fn describe_env(&self) -> String {
        if self.env.is_empty() {
            "no variables allowed".into()
        } else {
            format!("allowed: {}", self.env.join(", "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn relative_allow_entries_are_refused_with_the_reason() {
        for bad in ["robots/", "./bin/run.sh", "bin/run.sh", "../opt/"] {
            let e = ExecPolicy::commands(vec![bad.into()]).unwrap_err();
            assert!(e.contains("relative path") && e.contains(bad), "{bad}: {e}");
        }
        for bad in ["/opt/../etc/", "/opt/./robots/"] {
            let e = ExecPolicy::commands(vec![bad.into()]).unwrap_err();
            assert!(e.contains("refused"), "{bad}: {e}");
        }
        let p = ExecPolicy::commands(vec!["python3".into(), "/opt/".into()]).unwrap();
        assert!(p.check_command("python3").is_ok());
    }

    #[test]
    fn commands_are_off_until_allowed() {
        let off = ExecPolicy::disabled();
        assert!(!off.enabled());
        assert!(off
            .check_command("/bin/true")
            .unwrap_err()
            .contains("--exec-allow"));
        let p =
            ExecPolicy::commands(vec!["/opt/robots/".into(), "/usr/bin/python3".into()]).unwrap();
        assert!(p.check_command("/opt/robots/a.sh").is_ok());
        assert!(p.check_command("/usr/bin/python3").is_ok());
        assert!(p.check_command("/opt/robots/../../bin/sh").is_err());
        assert!(p.check_command("/bin/sh").is_err());
        assert!(p.check_command("python3").is_err());
    }

    #[test]
    fn code_loading_variables_are_refused_even_when_allowed() {
        let p = ExecPolicy::commands(vec!["/opt/".into()])
            .unwrap()
            .with_env(vec!["*".into()])
            .unwrap();
        for bad in [
            "BASH_FUNC_echo%%",
            "BASH_FUNC_x",
            "BASH_ENV",
            "ENV",
            "PATH",
            "LD_PRELOAD",
            "ld_library_path",
            "NODE_OPTIONS",
            "PYTHONSTARTUP",
            "PYTHONPATH",
            "PERL5OPT",
            "GCONV_PATH",
            "HOME",
            "SLOTPOOL_CONTEXT",
            "1ABC",
            "A=B",
            "",
        ] {
            assert!(p.check_env(&vars(&[(bad, "x")])).is_err(), "{bad:?}");
        }
        assert!(p.check_env(&vars(&[("GREETING", "hi")])).is_ok());
        assert!(p.check_env(&vars(&[("GREETING", "a\0b")])).is_err());
        let big = "x".repeat(MAX_ENV_VALUE + 1);
        assert!(p.check_env(&vars(&[("GREETING", &big)])).is_err());
    }

    #[test]
    fn names_must_be_allowed_by_the_worker() {
        let p = ExecPolicy::commands(vec!["/opt/".into()])
            .unwrap()
            .with_env(vec!["APP_*".into(), "GREETING".into()])
            .unwrap();
        assert!(p
            .check_env(&vars(&[("APP_MODE", "x"), ("GREETING", "y")]))
            .is_ok());
        let e = p.check_env(&vars(&[("OTHER", "x")])).unwrap_err();
        assert!(e.contains("--exec-env-allow OTHER"), "{e}");
        let none = ExecPolicy::commands(vec!["/opt/".into()]).unwrap();
        assert!(none.check_env(&vars(&[("GREETING", "y")])).is_err());
        assert!(none.check_env(&[]).is_ok());
    }

    #[test]
    fn an_allow_list_naming_a_refused_variable_is_a_configuration_error() {
        let base = || ExecPolicy::commands(vec!["/opt/".into()]).unwrap();
        for bad in [
            "LD_PRELOAD",
            "PATH",
            "LD_*",
            "BASH_FUNC_*",
            "SLOTPOOL_X",
            "A-B",
        ] {
            assert!(base().with_env(vec![bad.into()]).is_err(), "{bad}");
        }
        for ok in ["*", "APP_*", "GREETING", "A*"] {
            assert!(base().with_env(vec![ok.into()]).is_ok(), "{ok}");
        }
    }
}
