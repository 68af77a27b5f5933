//! Caches: each compile/kernel cache's state, size, warm/cold and last change.
use dflash_shared::format::format_bytes;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, TableState};
use ratatui::Frame;

use super::theme::Theme;
use crate::app::{wording, App};
use crate::fmt;

pub fn draw(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let caches = app
        .status
        .as_ref()
        .map(|s| s.caches.as_slice())
        .unwrap_or_default();
    if caches.is_empty() {
        let text = Span::styled("no cache inventory yet", theme.dim());
        frame.render_widget(Paragraph::new(text).block(Block::bordered()), area);
        return;
    }
    let [table_area, detail] =
        Layout::vertical([Constraint::Min(0), Constraint::Length(4)]).areas(area);
    let header =
        Row::new(["cache", "state", "size", "entries", "warm", "last change"]).style(theme.title());
    let rows = caches.iter().map(|c| {
        let state = if c.present {
            Cell::from(Span::styled("present", theme.ok()))
        } else {
            Cell::from(Span::styled("MISSING", theme.crit()))
        };
        let warm = if c.warm {
            Cell::from(Span::styled("warm", theme.ok()))
        } else {
            Cell::from(Span::styled("COLD", theme.warn()))
        };
        let changed = match c.last_change_ms {
            Some(ts) => format!(
                "{} ({} ago)",
                app.clock.hm(ts),
                fmt::duration_ms(app.now_ms - ts)
            ),
            None => "never seen".into(),
        };
        Row::new([
            Cell::from(wording::cache_label(&c.name)),
            state,
            Cell::from(format_bytes(c.size_bytes)),
            Cell::from(fmt::thousands(c.entries)),
            warm,
            Cell::from(changed),
        ])
    });
    let widths = [
        Constraint::Min(20),
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Length(5),
        Constraint::Length(22),
    ];
    let table = Table::new(rows, widths)
        .header(header)
        .block(Block::bordered().title(Span::styled(" Compile and kernel caches ", theme.title())))
        .row_highlight_style(theme.selected());
    let selected = app.selection.cache.min(caches.len() - 1);
    let mut state = TableState::default().with_selected(Some(selected));
    frame.render_stateful_widget(table, table_area, &mut state);

    let cache = &caches[selected];
    let mut lines = vec![Line::from(vec![
        Span::styled("path ", theme.dim()),
        Span::raw(cache.path.clone()),
    ])];
    if !app.read_only {
        lines.push(Line::from(Span::styled(
            "D deletes this cache after a typed confirmation; the daemon refuses while workers run",
            theme.dim(),
        )));
    }
    frame.render_widget(Paragraph::new(lines).block(Block::bordered()), detail);
}
