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
        Self::from_no_color(std::env::var_os("NO_COLOR").as_deref())
    }

    pub fn from_no_color(no_color: Option<&std::ffi::OsStr>) -> Self {
        Self {
            color: no_color.is_none_or(|v| v.is_empty()),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    #[test]
    fn no_color_keeps_emphasis_and_drops_colour() {
        let plain = Theme::from_no_color(Some(OsStr::new("1")));
        assert!(!plain.color);
        assert_eq!(plain.crit().fg, None);
        assert!(plain.crit().add_modifier.contains(Modifier::BOLD));
        assert_eq!(plain.dim().fg, None);
        let colored = Theme::from_no_color(None);
        assert_eq!(colored.crit().fg, Some(Color::Red));
        // An empty NO_COLOR does not count, per no-color.org.
        assert!(Theme::from_no_color(Some(OsStr::new(""))).color);
    }
}
