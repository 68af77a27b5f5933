//! GPUs: role, memory over time with a flat/volatile verdict, allocator reserved vs
//! allocated, utilization, power, temperature. Missing readings say so; they are never zeros.
use dflash_shared::format::format_bytes;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, TableState, Wrap};
use ratatui::Frame;

use super::chart::{self, TimeChart};
use super::theme::Theme;
use dflash_shared::health::grouping::{index_ranges, memory_gpu};
use dflash_shared::health::MemoryVerdict;

use crate::app::alerts::Verdict;

use crate::app::telemetry::{GpuHistory, Judged, AWAITING_THRESHOLDS};
use crate::app::App;
use crate::fmt;

pub fn draw(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    if let Some(reason) = &app.telemetry.gpu_unavailable {
        draw_unavailable(frame, area, app, reason, theme);
        return;
    }
    if app.telemetry.gpus.is_empty() {
        let text = Span::styled("no GPU readings yet", theme.dim());
        frame.render_widget(Paragraph::new(text).block(Block::bordered()), area);
        return;
    }
    let rows = app.telemetry.gpus.len() as u16;
    let [summary, table, history] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(rows + 3),
        Constraint::Min(0),
    ])
    .areas(area);
    draw_summary(frame, summary, app, theme);
    draw_table(frame, table, app, theme);
    if let Some(gpu) = app.telemetry.gpus.values().nth(app.selection.gpu) {
        draw_history(frame, history, app, gpu, theme);
    }
}

fn draw_unavailable(frame: &mut Frame, area: Rect, app: &App, reason: &str, theme: &Theme) {
    let headline = if reason.starts_with("NVML unavailable") {
        reason.to_string()
    } else {
        format!("NVML unavailable: {reason}")
    };
    let mut lines = vec![
        Line::from(Span::styled(headline, theme.warn())),
        Line::from(Span::styled(
            "No GPU figures are shown rather than made up. Host readings instead:",
            theme.dim(),
        )),
    ];
    match app.status.as_ref().and_then(|s| s.host.as_ref()) {
        Some(host) => {
            lines.push(Line::from(format!(
                "daemon process RSS {} · host memory {} / {} · daemon CPU {:.0}%",
                format_bytes(host.process_rss_bytes),
                format_bytes(host.host_memory_used_bytes),
                format_bytes(host.host_memory_total_bytes),
                host.process_cpu_pct
            )));
        }
        None => lines.push(Line::from(Span::styled("no host reading yet", theme.dim()))),
    }
    let block = Block::bordered().title(Span::styled(" GPUs ", theme.title()));
    frame.render_widget(
        Paragraph::new(lines).block(block).wrap(Wrap { trim: true }),
        area,
    );
}

/// The verdict in a table cell (16 columns); the summary line above says what "no
/// thresholds" waits for.
fn verdict_cell(verdict: &Judged<MemoryVerdict>, theme: &Theme) -> (String, Style) {
    let Judged::Verdict(verdict) = verdict else {
        return ("no thresholds".into(), theme.dim());
    };
    match verdict {
        MemoryVerdict::Collecting { samples } => (format!("judging ({samples})"), theme.dim()),
        MemoryVerdict::Unavailable => ("no reading".into(), theme.dim()),
        MemoryVerdict::Flat { stats } => (
            format!(
                "flat ±{}",
                format_bytes((stats.max_bytes - stats.min_bytes) / 2)
            ),
            theme.ok(),
        ),
        MemoryVerdict::Volatile { stats, .. } => (
            format!(
                "VOLATILE ±{}",
                format_bytes((stats.max_bytes - stats.min_bytes) / 2)
            ),
            theme.crit(),
        ),
    }
}

fn draw_summary(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let Some(thresholds) = app.telemetry.thresholds() else {
        let text = format!(" memory not judged yet: {AWAITING_THRESHOLDS}");
        let mut spans = vec![Span::styled(text, theme.dim())];
        // The daemon's own alerts stand meanwhile.
        let volatile = volatile_gpus(app);
        if !volatile.is_empty() {
            spans.push(Span::styled(
                format!(
                    " · dflashd: memory VOLATILE on GPU {}",
                    index_ranges(&volatile)
                ),
                theme.crit(),
            ));
        }
        frame.render_widget(Paragraph::new(Line::from(spans)), area);
        return;
    };
    let volatile = volatile_gpus(app);
    let window = fmt::duration_ms((thresholds.memory.window_s * 1000.0) as i64);
    let mut spans = Vec::new();
    if let Some(stale) = app.gpu_freshness().filter(|f| f.is_stale()) {
        spans.push(Span::styled(
            format!(
                " stale {}: no GPU reading since {} ·",
                fmt::duration_ms(stale.age_ms),
                app.clock.hm(stale.last_ms)
            ),
            theme.warn(),
        ));
    }
    spans.push(if volatile.is_empty() {
        Span::styled(
            format!(" memory flat on every judged GPU (last {window})"),
            theme.ok(),
        )
    } else {
        Span::styled(
            format!(
                " memory VOLATILE on GPU {} (last {window})",
                index_ranges(&volatile)
            ),
            theme.crit(),
        )
    });
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

/// GPUs whose memory is volatile by the alerts the console shows: the daemon's `memory:gpuN`
/// alerts, and the console's own verdicts where the daemon sent none (`App::shown_alerts`),
/// so this line and the Alerts panel never disagree.
fn volatile_gpus(app: &App) -> Vec<u32> {
    app.shown_alerts()
        .iter()
        .filter_map(|(a, _)| memory_gpu(&a.detector))
        .collect()
}

/// The daemon has an active memory alert for this GPU.
fn daemon_says_volatile(app: &App, gpu: u32) -> bool {
    app.shown_alerts()
        .iter()
        .any(|(a, v)| *v == Verdict::Daemon && memory_gpu(&a.detector) == Some(gpu))
}

fn na(theme: &Theme) -> Cell<'static> {
    Cell::from(Span::styled("n/a", theme.dim()))
}

fn draw_table(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let header = Row::new([
        "GPU",
        "name",
        "role",
        "memory used",
        "memory",
        "reserved/alloc",
        "util",
        "power",
        "temp",
    ])
    .style(theme.title());
    let rows = app.telemetry.gpus.values().map(|gpu| {
        let s = &gpu.latest;
        let memory = match (s.memory_used_bytes, s.memory_total_bytes) {
            (Some(used), Some(total)) => {
                Cell::from(format!("{} / {}", format_bytes(used), format_bytes(total)))
            }
            (Some(used), None) => Cell::from(format_bytes(used)),
            _ => na(theme),
        };
        let judged = app.telemetry.memory_verdict(s.index);
        let console_volatile = matches!(judged, Judged::Verdict(MemoryVerdict::Volatile { .. }));
        let (verdict, style) = if daemon_says_volatile(app, s.index) && !console_volatile {
            // The daemon's alert wins over a console verdict that has not caught up.
            ("VOLATILE, daemon".to_string(), theme.crit())
        } else {
            verdict_cell(&judged, theme)
        };
        let allocator = match &s.allocator {
            Some(a) => Cell::from(format!(
                "{} / {}",
                format_bytes(a.reserved_bytes),
                format_bytes(a.allocated_bytes)
            )),
            None => na(theme),
        };
        Row::new([
            Cell::from(s.index.to_string()),
            Cell::from(s.name.clone()),
            Cell::from(format!("{:?}", s.role).to_lowercase()),
            memory,
            Cell::from(Span::styled(verdict, style)),
            allocator,
            s.utilization_pct
                .map_or_else(|| na(theme), |u| Cell::from(format!("{u}%"))),
            s.power_w
                .map_or_else(|| na(theme), |p| Cell::from(format!("{p:.0} W"))),
            s.temperature_c
                .map_or_else(|| na(theme), |t| Cell::from(format!("{t}°C"))),
        ])
    });
    let widths = [
        Constraint::Length(3),
        Constraint::Min(8),
        Constraint::Length(7),
        Constraint::Length(17),
        Constraint::Length(16),
        Constraint::Length(17),
        Constraint::Length(5),
        Constraint::Length(6),
        Constraint::Length(5),
    ];
    let table = Table::new(rows, widths)
        .header(header)
        .block(Block::bordered().title(Span::styled(" GPUs ", theme.title())))
        .row_highlight_style(theme.selected());
    let mut state = TableState::default().with_selected(Some(app.selection.gpu));
    frame.render_stateful_widget(table, area, &mut state);
}

fn draw_history(frame: &mut Frame, area: Rect, app: &App, gpu: &GpuHistory, theme: &Theme) {
    let verdict_now = app.telemetry.memory_verdict(gpu.latest.index);
    let (verdict, style) = match verdict_now {
        Judged::AwaitingThresholds => (AWAITING_THRESHOLDS.to_string(), theme.dim()),
        judged => verdict_cell(&judged, theme),
    };
    let title = Line::from(vec![
        Span::styled(
            format!(" GPU {} memory over time: ", gpu.latest.index),
            theme.title(),
        ),
        Span::styled(format!("{verdict} "), style),
    ]);
    let mut lines = vec![chart::Line {
        name: "used (NVML)".into(),
        series: &gpu.memory_used,
        style,
    }];
    if !gpu.allocator_reserved.is_empty() {
        lines.push(chart::Line {
            name: "reserved".into(),
            series: &gpu.allocator_reserved,
            style: theme.reference_line(),
        });
        lines.push(chart::Line {
            name: "allocated".into(),
            series: &gpu.allocator_allocated,
            style: theme.accent(),
        });
    }
    TimeChart {
        block: Block::bordered().title(title),
        lines,
        levels: vec![],
        now_ms: app.now_ms,
        from_zero: false,
        format_value: |v| format_bytes(v.max(0.0) as u64),
    }
    .draw(frame, area, theme);
}
