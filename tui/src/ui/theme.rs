//! Styles. With `NO_COLOR` set (https://no-color.org) every style keeps its emphasis (bold,
//! reversed) and drops its colour.
use dflash_shared::events::Severity;
use ratatui::style::{Color, Modifier, Style};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Theme {
    pub color: bool,
}

impl Theme {
    /// Colour unless `NO_COLOR` is set to a non-empty value.
    pub fn from_env() -> Self {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Self { color: !no_color }
    }

    pub fn plain() -> Self {
        Self { color: false }
    }

    fn paint(&self, color: Color) -> Style {
        if self.color {
            Style::default().fg(color)
        } else {
            Style::default()
        }
    }

    pub fn text(&self) -> Style {
        Style::default()
    }

    pub fn dim(&self) -> Style {
        if self.color {
            Style::default().fg(Color::DarkGray)
        } else {
            Style::default().add_modifier(Modifier::DIM)
        }
    }

    pub fn title(&self) -> Style {
        self.paint(Color::Cyan).add_modifier(Modifier::BOLD)
    }

    pub fn accent(&self) -> Style {
        self.paint(Color::Cyan)
    }

    pub fn ok(&self) -> Style {
        self.paint(Color::Green)
    }

    pub fn warn(&self) -> Style {
        self.paint(Color::Yellow).add_modifier(Modifier::BOLD)
    }

    pub fn crit(&self) -> Style {
        self.paint(Color::Red).add_modifier(Modifier::BOLD)
    }

    pub fn severity(&self, level: Severity) -> Style {
        match level {
            Severity::Info => self.text(),
            Severity::Warn => self.warn(),
            Severity::Crit => self.crit(),
        }
    }

    pub fn selected(&self) -> Style {
        Style::default().add_modifier(Modifier::REVERSED)
    }

    /// The second series on a chart (baselines, watermarks).
    pub fn reference_line(&self) -> Style {
        self.paint(Color::Magenta)
    }

    pub fn danger_key(&self) -> Style {
        self.paint(Color::Red)
    }
}
