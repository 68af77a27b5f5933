//! The destructive-action modal: what would happen, then the typed run name.
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};
use ratatui::Frame;

use super::theme::Theme;
use crate::actions::{ActionFlow, Stage, UNLOCKABLE_KEYS};
use crate::app::App;
use crate::fmt;

pub fn draw(frame: &mut Frame, area: Rect, flow: &ActionFlow, app: &App, theme: &Theme) {
    let mut lines: Vec<Line> = Vec::new();
    if !matches!(flow.stage, Stage::ChoosingKey { .. }) {
        lines.push(Line::from(Span::styled("What this does", theme.title())));
        for text in &flow.local_consequences {
            lines.push(Line::from(format!("  • {text}")));
        }
    }
    if let Some(pending) = flow.pending() {
        if !pending.consequences.is_empty() {
            lines.push(Line::from(Span::styled("The daemon says", theme.title())));
            for text in &pending.consequences {
                lines.push(Line::from(format!("  • {text}")));
            }
        }
        lines.push(Line::from(Span::styled(
            format!(
                "  request {} · expires in {}",
                pending.id,
                fmt::duration_ms(pending.expires_ms - app.now_ms)
            ),
            theme.dim(),
        )));
    }
    lines.push(Line::from(""));
    match &flow.stage {
        Stage::ChoosingKey { index } => {
            lines.push(Line::from(Span::styled("Which locked key?", theme.title())));
            for (i, key) in UNLOCKABLE_KEYS.iter().enumerate() {
                let style = if i == *index {
                    theme.selected()
                } else {
                    theme.text()
                };
                lines.push(Line::from(Span::styled(format!("  {key}"), style)));
            }
            lines.push(Line::from(Span::styled(
                "↑↓ choose · Enter request · Esc cancel",
                theme.dim(),
            )));
        }
        Stage::Requesting => lines.push(Line::from(Span::styled(
            "Asking the daemon to file the request… (Esc cancels)",
            theme.dim(),
        ))),
        Stage::Confirming {
            typed, mismatch, ..
        } => {
            lines.push(Line::from(vec![
                Span::raw("Type the run name "),
                Span::styled(flow.run_name.clone(), theme.warn()),
                Span::raw(" and press Enter to confirm. Esc cancels."),
            ]));
            lines.push(Line::from(vec![
                Span::styled("> ", theme.accent()),
                Span::raw(typed.clone()),
                Span::styled("▏", theme.accent()),
            ]));
            if *mismatch {
                lines.push(Line::from(Span::styled(
                    "That is not the run name; nothing was confirmed.",
                    theme.crit(),
                )));
            }
        }
        Stage::Submitting { .. } => lines.push(Line::from(Span::styled(
            "Confirmed; waiting for the daemon…",
            theme.dim(),
        ))),
        Stage::Done { outcome } => {
            lines.push(Line::from(Span::styled(
                format!("Done: {outcome}"),
                theme.ok(),
            )));
            lines.push(Line::from(Span::styled("any key closes", theme.dim())));
        }
        Stage::Failed { message } => {
            lines.push(Line::from(Span::styled(
                format!("Not done: {message}"),
                theme.crit(),
            )));
            lines.push(Line::from(Span::styled("any key closes", theme.dim())));
        }
    }
    let width = 76.min(area.width);
    let inner_width = width.saturating_sub(2).max(1) as usize;
    let rows: usize = lines
        .iter()
        .map(|l| l.width().max(1).div_ceil(inner_width))
        .sum();
    let popup = super::centered(area, width, rows as u16 + 2);
    frame.render_widget(Clear, popup);
    let title = Span::styled(format!(" {} ", flow.action.title()), theme.crit());
    let block = Block::bordered().title(title);
    frame.render_widget(
        Paragraph::new(lines)
            .block(block)
            .wrap(Wrap { trim: false }),
        popup,
    );
}
