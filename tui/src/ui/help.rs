//! The `?` screen: every key, from the same table the key handler uses.
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};
use ratatui::Frame;

use super::theme::Theme;
use crate::app::{App, View, KEYMAP};

pub fn draw(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let mut lines = vec![Line::from(Span::styled("Views", theme.title()))];
    for view in View::ALL {
        lines.push(Line::from(format!("  {:<14}{}", view.key(), view.title())));
    }
    lines.push(Line::from(""));
    lines.push(Line::from(Span::styled("Keys", theme.title())));
    for (keys, what, _) in KEYMAP.iter().filter(|k| !k.2) {
        lines.push(Line::from(format!("  {keys:<14}{what}")));
    }
    lines.push(Line::from(""));
    let heading = if app.read_only {
        "Actions (disabled: read-only)"
    } else {
        "Actions (each opens a modal and needs the run name typed)"
    };
    lines.push(Line::from(Span::styled(heading, theme.title())));
    for (keys, what, _) in KEYMAP.iter().filter(|k| k.2) {
        let style = if app.read_only {
            theme.dim()
        } else {
            theme.danger_key()
        };
        lines.push(Line::from(vec![
            Span::styled(format!("  {keys:<14}"), style),
            Span::raw(*what),
        ]));
    }
    let height = lines.len() as u16 + 2;
    let popup = super::centered(area, 72, height);
    frame.render_widget(Clear, popup);
    let block = Block::bordered().title(Span::styled(" Help (Esc closes) ", theme.title()));
    frame.render_widget(Paragraph::new(lines).block(block), popup);
}
