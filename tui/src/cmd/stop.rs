//! `dflash-tui stop [--poweroff]`: files a pending request and prints its consequences.
//! Nothing stops until `dflash-tui confirm-stop` confirms it.
use std::process::ExitCode;

use dflash_shared::actions::{Action, PendingAction};
use dflash_shared::clock::now_ms;
use dflash_shared::protocol::{Request, Response};

use super::SocketArg;
use crate::client::Session;
use crate::fmt::{self, DisplayClock};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    socket: SocketArg,
    /// After the checkpoint, run the daemon's configured power-off command.
    #[arg(long)]
    poweroff: bool,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (session, welcome, _pushes) = Session::connect(&args.socket.path()).await?;
    let action = if args.poweroff {
        Action::PowerOff
    } else {
        Action::StopRun
    };
    let pending = match session.request(&Request::RequestAction { action }).await? {
        Response::Pending { action } => action,
        other => anyhow::bail!("expected the daemon to file a pending action, got {other:?}"),
    };
    print!(
        "{}",
        describe_filed(
            &pending,
            &welcome.run_name,
            &format!("{}{}", super::own_spelling(), args.socket.flag()),
            now_ms(),
            DisplayClock::Local
        )
    );
    Ok(ExitCode::SUCCESS)
}

/// What `stop` prints: the request, its consequences, and the two ways to confirm it.
/// `console` is how the operator types this console (its path and `--socket`, when needed).
pub fn describe_filed(
    pending: &PendingAction,
    run_name: &str,
    console: &str,
    now_ms: i64,
    clock: DisplayClock,
) -> String {
    let mut out = format!(
        "Filed pending request {} for run {run_name}: {}.\n",
        pending.id,
        pending.action.title()
    );
    out.push_str("Consequences:\n");
    if pending.consequences.is_empty() {
        out.push_str("  - (the daemon stated none)\n");
    }
    for line in &pending.consequences {
        out.push_str(&format!("  - {line}\n"));
    }
    out.push_str(&format!(
        "Nothing happens until it is confirmed; it expires at {} (in {}).\n",
        clock.hm(pending.expires_ms),
        fmt::duration_ms(pending.expires_ms - now_ms)
    ));
    out.push_str(&format!(
        "  confirm interactively:  {console} confirm-stop\n"
    ));
    out.push_str(&format!(
        "  confirm from a script:  {console} confirm-stop --token {} --yes-i-know   (audited)\n",
        pending.id
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filed_request_names_its_consequences_and_how_to_confirm() {
        let pending = PendingAction {
            id: "act-3".into(),
            action: Action::PowerOff,
            requested_by_uid: 1000,
            created_ms: 0,
            expires_ms: 5 * 60_000,
            consequences: vec![
                "last checkpoint 14 min ago".into(),
                "stable at 12.8K tok/s for 3 h".into(),
            ],
        };
        let text = describe_filed(
            &pending,
            "qwen36-drafter",
            "./target/release/dflash-tui --socket /tmp/d.sock",
            0,
            DisplayClock::utc(),
        );
        assert!(text.starts_with(
            "Filed pending request act-3 for run qwen36-drafter: Stop the run and power off the machine."
        ));
        assert!(text.contains("  - stable at 12.8K tok/s for 3 h\n"));
        assert!(text.contains("expires at 00:05 (in 5 min)"));
        assert!(text.contains(
            "./target/release/dflash-tui --socket /tmp/d.sock confirm-stop --token act-3 --yes-i-know"
        ));
    }
}
