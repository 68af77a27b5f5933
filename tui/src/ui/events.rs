//! Events: the journal timeline, filterable by level and text, and the latest log lines.
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use ratatui::Frame;

use super::theme::Theme;
use crate::app::{wording, App};

const LOG_LINES: u16 = 5;

pub fn draw(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let [filter_area, events_area, logs_area] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(LOG_LINES + 2),
    ])
    .areas(area);
    draw_filter(frame, filter_area, app, theme);

    let matching: Vec<_> = app.journal.filtered(&app.event_filter).collect();
    let visible = events_area.height.saturating_sub(2) as usize;
    let end = matching.len().saturating_sub(app.selection.events_scroll);
    let start = end.saturating_sub(visible);
    let lines: Vec<Line> = matching[start..end]
        .iter()
        .map(|e| {
            Line::from(vec![
                Span::styled(format!("{} ", app.clock.hms(e.ts_ms)), theme.dim()),
                Span::styled(
                    format!("{:<5}", wording::severity_word(e.severity).to_uppercase()),
                    theme.severity(e.severity),
                ),
                Span::styled(
                    format!("{:<13} ", wording::kind_tag(&e.kind)),
                    theme.accent(),
                ),
                Span::raw(wording::describe(&e.kind)),
            ])
        })
        .collect();
    let position = if app.selection.events_scroll == 0 {
        "newest".to_string()
    } else {
        format!("{} back", app.selection.events_scroll)
    };
    let title = format!(
        " Journal ({} of {}, {position}) ",
        matching.len(),
        app.journal.events().len()
    );
    let block = Block::bordered().title(Span::styled(title, theme.title()));
    frame.render_widget(Paragraph::new(lines).block(block), events_area);

    let logs: Vec<Line> = {
        let mut recent: Vec<_> = app.journal.logs().rev().take(LOG_LINES as usize).collect();
        recent.reverse();
        recent
            .into_iter()
            .map(|l| {
                Line::from(vec![
                    Span::styled(format!("{:<5} ", l.level.to_uppercase()), theme.dim()),
                    Span::raw(l.line.clone()),
                ])
            })
            .collect()
    };
    let logs = if logs.is_empty() {
        let why = match app.source {
            crate::app::Source::Replay(_) => "recordings carry no log lines",
            crate::app::Source::Live { .. } => "no log lines yet",
        };
        vec![Line::from(Span::styled(why, theme.dim()))]
    } else {
        logs
    };
    let block = Block::bordered().title(Span::styled(" Log ", theme.title()));
    frame.render_widget(Paragraph::new(logs).block(block), logs_area);
}

fn draw_filter(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let level = match app.event_filter.min_severity {
        None => "all levels".to_string(),
        Some(level) => format!("{} and above", wording::severity_word(level).to_lowercase()),
    };
    let text = if app.editing_filter {
        format!("{}▏", app.event_filter.text)
    } else if app.event_filter.text.is_empty() {
        "none".into()
    } else {
        format!("'{}'", app.event_filter.text)
    };
    let hint = if app.editing_filter {
        "  Enter keeps · Esc clears"
    } else {
        "  / text · f level · Esc clears"
    };
    let line = Line::from(vec![
        Span::styled(" filter: ", theme.dim()),
        Span::raw(format!("{level} · text {text}")),
        Span::styled(hint, theme.dim()),
    ]);
    frame.render_widget(Paragraph::new(line), area);
}
