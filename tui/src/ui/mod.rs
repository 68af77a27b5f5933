//! Pure drawing: every function here reads the app state and draws into a frame; nothing
//! here changes state or does I/O.
mod acceptance;
pub mod bignum;
mod caches;
mod chart;
mod checkpoints;
mod events;
mod gpus;
mod help;
mod modal;
mod overview;
mod queue;
pub mod theme;

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Tabs};
use ratatui::Frame;

use crate::app::{App, LinkState, Source, View};
use crate::fmt;
use theme::Theme;

/// Below this the console shows a one-line request to enlarge the terminal.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 16;

pub fn draw(frame: &mut Frame, app: &App, theme: &Theme) {
    let area = frame.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        let text = format!(
            "terminal too small: {}×{}, need {MIN_WIDTH}×{MIN_HEIGHT} (q quits)",
            area.width, area.height
        );
        frame.render_widget(Paragraph::new(text).style(theme.warn()), area);
        return;
    }
    let [header, tabs, body, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    draw_header(frame, header, app, theme);
    draw_tabs(frame, tabs, app, theme);
    match app.view {
        View::Overview => overview::draw(frame, body, app, theme),
        View::Gpus => gpus::draw(frame, body, app, theme),
        View::Queue => queue::draw(frame, body, app, theme),
        View::Caches => caches::draw(frame, body, app, theme),
        View::Events => events::draw(frame, body, app, theme),
        View::Checkpoints => checkpoints::draw(frame, body, app, theme),
    }
    draw_footer(frame, footer, app, theme);
    if app.help_open {
        help::draw(frame, body, app, theme);
    }
    if let Some(flow) = &app.modal {
        modal::draw(frame, body, flow, app, theme);
    }
}

fn draw_header(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let mut spans = vec![Span::styled(" dflash ", theme.title())];
    if let Some(name) = app.run_name() {
        spans.push(Span::styled(name.to_string(), theme.text()));
    }
    // The last status the daemon sent says Training; once it journaled the end, say that.
    // A status that is no longer live is said as such, with its age: a daemon that went away
    // (or a recording that stopped) is not "Training" for the next hour.
    match (app.ended(), &app.status) {
        (Some(ending), _) => spans.push(Span::styled(
            format!(" · {}", ending.kind.word()),
            theme.accent(),
        )),
        (None, Some(status)) if app.status_is_old() => {
            let age = app.status_freshness().map_or_else(String::new, |f| {
                format!(", {} ago", fmt::duration_ms(f.age_ms))
            });
            spans.push(Span::styled(
                format!(
                    " · daemon last said: {}{age}",
                    format!("{:?}", status.run.state).to_lowercase()
                ),
                theme.warn(),
            ));
        }
        (None, Some(status)) => spans.push(Span::styled(
            format!(" · {:?}", status.run.state),
            theme.accent(),
        )),
        (None, None) => {}
    }
    spans.push(Span::raw("  "));
    spans.extend(source_spans(app, theme));
    let badge = badge(app, theme);
    let [left, right] =
        Layout::horizontal([Constraint::Min(0), Constraint::Length(badge.width() as u16)])
            .areas(area);
    frame.render_widget(Paragraph::new(Line::from(spans)), left);
    frame.render_widget(Paragraph::new(Line::from(badge)), right);
}

/// The header badge: the worst shown alert, or OK, but never OK over stale data or no data:
/// "STALE 14 min" (after the worst alert's level, if any) once the run's figures are stale
/// (`app::freshness`), "NO DATA" before the first figure. A run that ended keeps its alerts'
/// badge: its figures are final, not stale.
fn badge(app: &App, theme: &Theme) -> Span<'static> {
    let reversed =
        |style: ratatui::style::Style| style.add_modifier(ratatui::style::Modifier::REVERSED);
    let worst = app.worst_alert();
    let level_word = |level| crate::app::wording::severity_word(level).to_uppercase();
    if app.ended().is_none() {
        if let Some(stale) = app.stale() {
            let age = fmt::duration_ms(stale.age_ms);
            return match worst {
                Some(level) => Span::styled(
                    format!(" {} · STALE {age} ", level_word(level)),
                    reversed(theme.severity(level)),
                ),
                None => Span::styled(format!(" STALE {age} "), reversed(theme.warn())),
            };
        }
        if worst.is_none() && app.no_data() {
            return Span::styled(" NO DATA ", reversed(theme.dim()));
        }
    }
    match worst {
        Some(level) => Span::styled(
            format!(" {} ", level_word(level)),
            reversed(theme.severity(level)),
        ),
        None => Span::styled(" OK ", theme.ok()),
    }
}

fn source_spans<'a>(app: &'a App, theme: &Theme) -> Vec<Span<'a>> {
    match &app.source {
        Source::Replay(replay) => {
            let state = if replay.finished {
                "end of recording"
            } else if replay.paused {
                "paused"
            } else {
                "playing"
            };
            let file = std::path::Path::new(&replay.file)
                .file_name()
                .map_or(replay.file.clone(), |f| f.to_string_lossy().into_owned());
            vec![Span::styled(
                format!(
                    "▶ {} {} · {}/{} ×{} {state}",
                    file,
                    app.clock.hms(app.now_ms),
                    replay.position,
                    replay.total,
                    replay.speed,
                ),
                theme.accent(),
            )]
        }
        Source::Live { socket } => match (&app.link, app.ended()) {
            // The run ended and the daemon exited with it: that is not an outage.
            (LinkState::Lost { .. } | LinkState::Connecting { .. }, Some(ending)) => {
                vec![Span::styled(
                    format!("■ run {}; dflashd has exited", ending.kind.word()),
                    theme.dim(),
                )]
            }
            (LinkState::Connected { welcome, .. }, _) => vec![Span::styled(
                format!("● connected (dflashd pid {})", welcome.daemon_pid),
                theme.ok(),
            )],
            (LinkState::Connecting { attempt }, None) => vec![Span::styled(
                format!("◌ connecting to {socket} (attempt {attempt})"),
                theme.warn(),
            )],
            (
                LinkState::Lost {
                    reason,
                    retry_at_ms,
                },
                None,
            ) => vec![Span::styled(
                format!(
                    "✕ daemon unreachable: {reason}; retrying in {}",
                    fmt::duration_ms(retry_at_ms - app.now_ms)
                ),
                theme.crit(),
            )],
        },
    }
}

fn draw_tabs(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let titles: Vec<Line> = View::ALL
        .iter()
        .map(|v| Line::from(format!("{} {}", v.key(), v.title())))
        .collect();
    let selected = View::ALL.iter().position(|v| *v == app.view);
    let tabs = Tabs::new(titles)
        .select(selected)
        .style(theme.dim())
        .highlight_style(
            theme
                .title()
                .add_modifier(ratatui::style::Modifier::REVERSED),
        );
    frame.render_widget(tabs, area);
}

fn draw_footer(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    if let Some(notice) = app.active_notice() {
        frame.render_widget(Paragraph::new(notice.to_string()).style(theme.warn()), area);
        return;
    }
    let mut spans = vec![Span::styled(
        " ? help  q quit  1-6 views  ↑↓ select ",
        theme.dim(),
    )];
    if app.read_only {
        let why = match app.source {
            Source::Replay(_) => " replay: read-only ",
            Source::Live { .. } => " read-only: actions disabled ",
        };
        spans.push(Span::styled(why, theme.warn()));
    } else {
        spans.push(Span::styled(
            " S stop  K kill  P power-off  U unlock  D delete cache (typed confirmation) ",
            theme.danger_key(),
        ));
    }
    if matches!(app.source, Source::Replay(_)) {
        spans.push(Span::styled(
            " Space pause  + faster  - slower ",
            theme.dim(),
        ));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// A rectangle of at most `width`×`height` centred in `area`.
pub(crate) fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let width = width.min(area.width);
    let height = height.min(area.height);
    Rect {
        x: area.x + (area.width - width) / 2,
        y: area.y + (area.height - height) / 2,
        width,
        height,
    }
}
