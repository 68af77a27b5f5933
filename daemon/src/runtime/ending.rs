//! Why a run loop returned, and what that means for the process.

/// Why the loop returned.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// The schedule is done (every epoch).
    Finished { checkpoint: Option<String> },
    /// `--max-steps` steps were taken.
    StepLimit { checkpoint: Option<String> },
    Signal {
        signal: i32,
        checkpoint: Option<String>,
    },
    /// A confirmed stop (or power-off) through the control plane.
    Stopped {
        action_id: String,
        checkpoint: Option<String>,
    },
    /// A confirmed kill: no checkpoint.
    Killed { action_id: String },
    /// The control plane shut down without a command (it had to).
    Shutdown { checkpoint: Option<String> },
    /// A step or checkpoint failed; the run was paused until stopped.
    Failed { error: String },
}

impl Ending {
    /// Operators stopping a run (signal, stop, kill) is success; a failure is not.
    pub fn exit_code(&self) -> u8 {
        match self {
            Ending::Failed { .. } => 1,
            _ => 0,
        }
    }

    pub fn checkpoint(&self) -> Option<&str> {
        match self {
            Ending::Finished { checkpoint }
            | Ending::StepLimit { checkpoint }
            | Ending::Signal { checkpoint, .. }
            | Ending::Stopped { checkpoint, .. }
            | Ending::Shutdown { checkpoint } => checkpoint.as_deref(),
            Ending::Killed { .. } | Ending::Failed { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_failures_exit_non_zero() {
        assert_eq!(
            Ending::Killed {
                action_id: "k".into()
            }
            .exit_code(),
            0
        );
        assert_eq!(Ending::Failed { error: "x".into() }.exit_code(), 1);
        let e = Ending::Signal {
            signal: libc::SIGTERM,
            checkpoint: Some("/c".into()),
        };
        assert_eq!((e.exit_code(), e.checkpoint()), (0, Some("/c")));
    }
}
