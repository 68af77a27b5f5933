//! `dflash-tui confirm-stop [--token ID --yes-i-know]`: confirms a pending stop or power-off.
//! Interactively it needs the run name typed on a terminal. Without a terminal it refuses and
//! changes nothing, unless the script says `--token ID --yes-i-know` (the daemon audits it).
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use dflash_shared::actions::{Action, PendingAction};
use dflash_shared::clock::now_ms;
use dflash_shared::events::EventKind;
use dflash_shared::format::format_bytes;
use dflash_shared::protocol::{Request, Response, Topic};
use tokio::sync::mpsc;

use super::SocketArg;
use crate::client::session::Push;
use crate::client::Session;
use crate::fmt::{self, DisplayClock};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    socket: SocketArg,
    /// For scripts: the id of the pending request to confirm (needs --yes-i-know).
    #[arg(long, value_name = "ID")]
    token: Option<String>,
    /// Confirm without typing the run name. Deliberately long; there is no short form.
    #[arg(long = "yes-i-know")]
    yes_i_know: bool,
    /// How long to wait for the daemon to checkpoint and stop after confirming.
    #[arg(long, value_name = "SECS", default_value_t = 900)]
    wait: u64,
}

/// Refusals exit with this code; nothing was confirmed.
pub const REFUSED: u8 = 2;

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Refuse(String),
    /// Confirm this request without asking (the audited script form).
    Confirm {
        action_id: String,
        via: &'static str,
    },
    /// Ask on the terminal which request, then for the run name.
    Ask(Vec<PendingAction>),
}

pub fn is_stop(action: &Action) -> bool {
    matches!(action, Action::StopRun | Action::PowerOff)
}

/// Decides what to do from the flags, the pending stops and whether a person is at a terminal.
pub fn decide(
    token: Option<&str>,
    yes_i_know: bool,
    pending: &[PendingAction],
    interactive: bool,
) -> Decision {
    let stops: Vec<PendingAction> = pending
        .iter()
        .filter(|p| is_stop(&p.action))
        .cloned()
        .collect();
    match (token, yes_i_know) {
        (Some(_), false) => Decision::Refuse(
            "--token needs --yes-i-know: confirming without typing the run name must be explicit; \
             nothing was confirmed"
                .into(),
        ),
        (None, true) => Decision::Refuse(
            "--yes-i-know needs --token ID naming the pending request; nothing was confirmed"
                .into(),
        ),
        (Some(id), true) => match stops.iter().find(|p| p.id == id) {
            Some(p) => Decision::Confirm {
                action_id: p.id.clone(),
                via: "token",
            },
            None => Decision::Refuse(format!(
                "no pending stop or power-off request has id {id}; nothing was confirmed"
            )),
        },
        (None, false) if !interactive => Decision::Refuse(
            "confirm-stop needs an interactive terminal to type the run name; nothing was \
             confirmed. Scripts: dflash-tui confirm-stop --token ID --yes-i-know (audited)"
                .into(),
        ),
        (None, false) if stops.is_empty() => Decision::Refuse(
            "no pending stop or power-off request; file one with `dflash-tui stop`".into(),
        ),
        (None, false) => Decision::Ask(stops),
    }
}

pub fn describe_pending(pending: &[PendingAction], now_ms: i64, clock: DisplayClock) -> String {
    let stops: Vec<&PendingAction> = pending.iter().filter(|p| is_stop(&p.action)).collect();
    if stops.is_empty() {
        return "No pending stop or power-off request.\n".into();
    }
    let mut out = String::from("Pending stop and power-off requests:\n");
    for (i, p) in stops.iter().enumerate() {
        out.push_str(&format!(
            "  [{}] {}: {} (uid {}, filed {} ago, expires {} / in {})\n",
            i + 1,
            p.id,
            p.action.title(),
            p.requested_by_uid,
            fmt::duration_ms(now_ms - p.created_ms),
            clock.hm(p.expires_ms),
            fmt::duration_ms(p.expires_ms - now_ms)
        ));
        for line in &p.consequences {
            out.push_str(&format!("        - {line}\n"));
        }
    }
    out
}

fn prompt(question: &str) -> Option<String> {
    eprint!("{question}");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer).ok()?;
    Some(answer.trim_end_matches(['\n', '\r']).to_string())
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (session, welcome, pushes) = Session::connect(&args.socket.path()).await?;
    let status = match session.request(&Request::Status).await? {
        Response::Status(status) => status,
        other => anyhow::bail!("expected the daemon's status, got {other:?}"),
    };
    let pending = &status.pending_actions;
    let now = now_ms();
    print!("{}", describe_pending(pending, now, DisplayClock::Local));
    let interactive = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    let run_name = status.run.name.clone();
    let (action_id, typed, via) = match decide(
        args.token.as_deref(),
        args.yes_i_know,
        pending,
        interactive,
    ) {
        Decision::Refuse(message) => {
            eprintln!("dflash-tui: {message}");
            return Ok(ExitCode::from(REFUSED));
        }
        Decision::Confirm { action_id, via } => (action_id, run_name.clone(), via),
        Decision::Ask(stops) => {
            let chosen = if stops.len() == 1 {
                stops[0].clone()
            } else {
                let answer = tokio::task::spawn_blocking(|| prompt("Which request? number: "))
                    .await?
                    .unwrap_or_default();
                match answer
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .and_then(|n| stops.get(n.wrapping_sub(1)))
                {
                    Some(p) => p.clone(),
                    None => {
                        eprintln!("dflash-tui: '{answer}' is not one of the listed numbers; nothing was confirmed");
                        return Ok(ExitCode::from(REFUSED));
                    }
                }
            };
            let question = format!("Type the run name ({run_name}) to confirm {}: ", chosen.id);
            let typed = tokio::task::spawn_blocking(move || prompt(&question))
                .await?
                .unwrap_or_default();
            if typed != run_name {
                eprintln!("dflash-tui: that is not the run name; nothing was confirmed");
                return Ok(ExitCode::from(REFUSED));
            }
            (chosen.id, typed, "tty")
        }
    };
    debug_assert_eq!(welcome.run_name, run_name);

    // Subscribe first so the checkpoint event cannot slip past between confirm and exit.
    session
        .request(&Request::Subscribe {
            topics: vec![Topic::Events],
        })
        .await?;
    let request = Request::Confirm {
        action_id: action_id.clone(),
        run_name: typed,
        via: via.into(),
    };
    // The daemon answers once the run has checkpointed and stopped.
    let wait = Duration::from_secs(args.wait);
    match session.request_with_timeout(&request, wait).await? {
        Response::Executed { outcome, .. } => println!("Confirmed {action_id}: {outcome}"),
        Response::Ok => println!("Confirmed {action_id}; the daemon is checkpointing."),
        other => anyhow::bail!("unexpected reply to the confirmation: {other:?}"),
    }
    report_checkpoint(pushes, wait).await
}

/// Waits for the daemon's final checkpoint (or its exit) and says where it is.
async fn report_checkpoint(
    mut pushes: mpsc::Receiver<Push>,
    wait: Duration,
) -> anyhow::Result<ExitCode> {
    let deadline = tokio::time::sleep(wait);
    tokio::pin!(deadline);
    let mut last_checkpoint: Option<String> = None;
    loop {
        tokio::select! {
            _ = &mut deadline => {
                eprintln!("dflash-tui: no stop reported within {}s; check `dflash-tui tail`", wait.as_secs());
                return Ok(ExitCode::FAILURE);
            }
            push = pushes.recv() => match push {
                Some(Push::Frame(Response::Event(event))) => match event.kind {
                    EventKind::CheckpointWritten { step, path, bytes } => {
                        println!("Checkpoint written: {path} (step {step}, {})", format_bytes(bytes));
                        last_checkpoint = Some(path);
                    }
                    EventKind::RunStopped { reason, checkpoint } => {
                        match checkpoint.or(last_checkpoint) {
                            Some(path) => println!("The run stopped ({reason}); final checkpoint: {path}"),
                            None => println!("The run stopped ({reason}) without a checkpoint"),
                        }
                        return Ok(ExitCode::SUCCESS);
                    }
                    _ => {}
                },
                None | Some(Push::Closed(_)) => {
                    return Ok(match last_checkpoint {
                        Some(path) => {
                            println!("The daemon exited; final checkpoint: {path}");
                            ExitCode::SUCCESS
                        }
                        None => {
                            eprintln!("dflash-tui: the daemon closed the connection before reporting a checkpoint; see `dflash-tui tail`");
                            ExitCode::FAILURE
                        }
                    });
                }
                Some(_) => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(id: &str, action: Action) -> PendingAction {
        PendingAction {
            id: id.into(),
            action,
            requested_by_uid: 1000,
            created_ms: 0,
            expires_ms: 600_000,
            consequences: vec!["last checkpoint 14 min ago".into()],
        }
    }

    #[test]
    fn without_a_terminal_it_refuses_unless_token_and_yes_i_know() {
        let list = vec![pending("act-1", Action::StopRun)];
        assert!(
            matches!(decide(None, false, &list, false), Decision::Refuse(m) if m.contains("interactive terminal"))
        );
        assert!(
            matches!(decide(Some("act-1"), false, &list, false), Decision::Refuse(m) if m.contains("--yes-i-know"))
        );
        assert!(matches!(
            decide(None, true, &list, false),
            Decision::Refuse(_)
        ));
        assert_eq!(
            decide(Some("act-1"), true, &list, false),
            Decision::Confirm {
                action_id: "act-1".into(),
                via: "token"
            }
        );
    }

    #[test]
    fn only_stop_and_poweroff_requests_are_confirmed_here() {
        let list = vec![
            pending(
                "act-1",
                Action::DeleteCache {
                    name: "triton".into(),
                },
            ),
            pending("act-2", Action::PowerOff),
        ];
        assert!(
            matches!(decide(Some("act-1"), true, &list, false), Decision::Refuse(m) if m.contains("act-1"))
        );
        match decide(None, false, &list, true) {
            Decision::Ask(stops) => assert_eq!(
                stops.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
                vec!["act-2"]
            ),
            other => panic!("expected to ask, got {other:?}"),
        }
        assert!(
            matches!(decide(None, false, &list[..1], true), Decision::Refuse(m) if m.contains("no pending"))
        );
    }

    #[test]
    fn the_listing_shows_each_request_with_its_consequences() {
        let text = describe_pending(
            &[pending("act-2", Action::StopRun)],
            60_000,
            DisplayClock::utc(),
        );
        assert!(text.contains("[1] act-2: Stop the run (checkpoint, then exit) (uid 1000, filed 1 min ago, expires 00:10 / in 9 min)"));
        assert!(text.contains("- last checkpoint 14 min ago"));
    }
}
