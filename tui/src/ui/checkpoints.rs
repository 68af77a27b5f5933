//! Checkpoints: what is on disk and how old it is.
use dflash_shared::format::format_bytes;
use ratatui::layout::{Constraint, Rect};
use ratatui::text::Span;
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, TableState};
use ratatui::Frame;

use super::theme::Theme;
use crate::app::App;
use crate::fmt;

pub fn draw(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let mut checkpoints: Vec<_> = app
        .status
        .as_ref()
        .map(|s| s.checkpoints.iter().collect())
        .unwrap_or_default();
    if checkpoints.is_empty() {
        let text = Span::styled("no checkpoint written yet", theme.dim());
        frame.render_widget(Paragraph::new(text).block(Block::bordered()), area);
        return;
    }
    checkpoints.sort_by_key(|c| std::cmp::Reverse(c.step));
    let header = Row::new(["step", "written", "age", "size", "path"]).style(theme.title());
    let rows = checkpoints.iter().map(|c| {
        Row::new([
            Cell::from(fmt::thousands(c.step)),
            Cell::from(app.clock.date_hm(c.written_ms)),
            Cell::from(format!(
                "{} ago",
                fmt::duration_ms(app.now_ms - c.written_ms)
            )),
            Cell::from(format_bytes(c.bytes)),
            Cell::from(c.path.clone()),
        ])
    });
    let widths = [
        Constraint::Length(11),
        Constraint::Length(16),
        Constraint::Length(14),
        Constraint::Length(9),
        Constraint::Min(10),
    ];
    let title = format!(" Checkpoints (newest first, {}) ", checkpoints.len());
    let table = Table::new(rows, widths)
        .header(header)
        .block(Block::bordered().title(Span::styled(title, theme.title())))
        .row_highlight_style(theme.selected());
    let selected = app.selection.checkpoint.min(checkpoints.len() - 1);
    let mut state = TableState::default().with_selected(Some(selected));
    frame.render_stateful_widget(table, area, &mut state);
}
