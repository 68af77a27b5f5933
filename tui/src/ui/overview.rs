//! Overview: is the run healthy at a glance? Alerts first, then throughput, progress, curves.
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Wrap};
use ratatui::Frame;

use super::chart::{self, TimeChart};
use super::theme::Theme;
use super::bignum;
use crate::app::{wording, App};
use crate::fmt;

pub fn draw(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let alerts = app.explained_alerts();
    let inner_width = area.width.saturating_sub(2).max(1) as usize;
    let alert_rows: usize = alerts
        .iter()
        .map(|(_, text)| (text.chars().count() + 7).div_ceil(inner_width))
        .sum();
    let alert_height = (alert_rows.max(1) + 2).min(8) as u16;
    let [alerts_area, top, bottom] = Layout::vertical([
        Constraint::Length(alert_height),
        Constraint::Length(11),
        Constraint::Min(0),
    ])
    .areas(area);
    draw_alerts(frame, alerts_area, &alerts, theme);
    let [throughput, run] =
        Layout::horizontal([Constraint::Percentage(58), Constraint::Percentage(42)]).areas(top);
    draw_throughput(frame, throughput, app, theme);
    draw_run(frame, run, app, theme);
    let [loss, tau] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(bottom);
    TimeChart {
        block: Block::bordered().title(Span::styled(" Loss ", theme.title())),
        lines: vec![chart::Line {
            name: "loss".into(),
            series: &app.telemetry.loss,
            style: theme.accent(),
        }],
        levels: vec![],
        now_ms: app.now_ms,
        from_zero: false,
        format_value: |v| format!("{v:.3}"),
    }
    .draw(frame, loss, theme);
    TimeChart {
        block: Block::bordered().title(Span::styled(" τ (acceptance length) ", theme.title())),
        lines: vec![chart::Line {
            name: "τ".into(),
            series: &app.telemetry.tau,
            style: theme.accent(),
        }],
        levels: vec![],
        now_ms: app.now_ms,
        from_zero: false,
        format_value: |v| format!("{v:.2}"),
    }
    .draw(frame, tau, theme);
}

fn draw_alerts(
    frame: &mut Frame,
    area: Rect,
    alerts: &[(dflash_shared::events::Severity, String)],
    theme: &Theme,
) {
    let block = Block::bordered().title(Span::styled(" Alerts ", theme.title()));
    let lines: Vec<Line> = if alerts.is_empty() {
        vec![Line::from(Span::styled("No active alerts.", theme.ok()))]
    } else {
        alerts
            .iter()
            .map(|(level, text)| {
                Line::from(vec![
                    Span::styled(
                        format!("{:<5}", wording::severity_word(*level).to_uppercase()),
                        theme.severity(*level),
                    ),
                    Span::raw(text.clone()),
                ])
            })
            .collect()
    };
    frame.render_widget(
        Paragraph::new(lines).block(block).wrap(Wrap { trim: false }),
        area,
    );
}

fn draw_throughput(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let block = Block::bordered().title(Span::styled(" Throughput (tok/s) ", theme.title()));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [big, baseline, history] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(1),
        Constraint::Min(0),
    ])
    .areas(inner);

    let tokens = app.tokens_per_s();
    let headline = tokens.map_or_else(|| "—".to_string(), fmt::si);
    let style = match app.alerts.worst() {
        Some(level) => theme.severity(level),
        None => theme.ok(),
    };
    let big_lines: Vec<Line> = match bignum::render(&headline) {
        Some(rows) => rows
            .into_iter()
            .map(|r| Line::from(Span::styled(format!(" {r}"), style)))
            .collect(),
        None => vec![Line::from(Span::styled(format!(" {headline}"), style))],
    };
    frame.render_widget(Paragraph::new(big_lines), big);

    let mut spans = Vec::new();
    match (tokens, app.baseline_tokens_per_s()) {
        (Some(now), Some(base)) if base > 0.0 => {
            spans.push(Span::raw(format!(" baseline {} · ", fmt::si(base))));
            spans.push(Span::styled(format!("{:.0}% of baseline", 100.0 * now / base), style));
        }
        (_, Some(base)) => spans.push(Span::raw(format!(" baseline {}", fmt::si(base)))),
        (_, None) => spans.push(Span::styled(" baseline: not yet established", theme.dim())),
    }
    if let Some(since) = app.status.as_ref().and_then(|s| s.throughput.stable_since_ms) {
        spans.push(Span::raw(format!(
            " · stable for {}",
            fmt::duration_ms(app.now_ms - since)
        )));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), baseline);

    TimeChart {
        block: Block::default(),
        lines: vec![chart::Line {
            name: "tok/s".into(),
            series: &app.telemetry.tokens_per_s,
            style,
        }],
        levels: app
            .baseline_tokens_per_s()
            .map(|b| chart::Level {
                name: "baseline".into(),
                value: b,
                style: theme.reference_line(),
            })
            .into_iter()
            .collect(),
        now_ms: app.now_ms,
        from_zero: true,
        format_value: fmt::si,
    }
    .draw(frame, history, theme);
}

fn draw_run(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let block = Block::bordered().title(Span::styled(" Run ", theme.title()));
    let mut lines = Vec::new();
    let label = |text: &'static str| Span::styled(text, theme.dim());
    match &app.status {
        Some(status) => {
            let run = &status.run;
            lines.push(Line::from(vec![label("state   "), Span::raw(format!("{:?}", run.state))]));
            let (step, epoch) = app.step_epoch().unwrap_or((run.step, run.epoch));
            let pct = if run.total_steps > 0 {
                format!(" ({:.1}%)", 100.0 * step as f64 / run.total_steps as f64)
            } else {
                String::new()
            };
            lines.push(Line::from(vec![
                label("epoch   "),
                Span::raw(format!("{epoch} / {}", run.epochs)),
            ]));
            lines.push(Line::from(vec![
                label("step    "),
                Span::raw(format!(
                    "{} / {}{pct}",
                    fmt::thousands(step),
                    fmt::thousands(run.total_steps)
                )),
            ]));
            let eta = match app.eta_ms() {
                Some(eta) => format!(
                    "{} (in {})",
                    app.clock.date_hm(eta),
                    fmt::duration_ms(eta - app.now_ms)
                ),
                None => "unknown until steps are measured".into(),
            };
            lines.push(Line::from(vec![
                label("ETA     "),
                Span::raw(format!("end of epoch {}: {eta}", run.epochs)),
            ]));
            let loss = status.last_loss.map_or("—".into(), |l| format!("{l:.3}"));
            let tau = status.last_tau.map_or("—".into(), |t| format!("{t:.2}"));
            lines.push(Line::from(vec![label("loss    "), Span::raw(format!("{loss}   τ {tau}"))]));
            let checkpoint = status.checkpoints.iter().max_by_key(|c| c.step);
            lines.push(Line::from(vec![
                label("saved   "),
                Span::raw(match checkpoint {
                    Some(c) => format!(
                        "step {} · {} ago",
                        fmt::thousands(c.step),
                        fmt::duration_ms(app.now_ms - c.written_ms)
                    ),
                    None => "no checkpoint yet".into(),
                }),
            ]));
            for pending in &status.pending_actions {
                lines.push(Line::from(vec![
                    Span::styled("pending ", theme.warn()),
                    Span::raw(format!(
                        "{} {} · expires in {}",
                        pending.id,
                        pending.action.title(),
                        fmt::duration_ms(pending.expires_ms - app.now_ms)
                    )),
                ]));
            }
        }
        None => lines.push(Line::from(Span::styled("waiting for the daemon's status…", theme.dim()))),
    }
    frame.render_widget(
        Paragraph::new(lines).block(block).wrap(Wrap { trim: true }),
        area,
    );
}
