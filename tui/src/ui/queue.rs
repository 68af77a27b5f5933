//! Queue: depth against the watermarks, producer and consumer rates, and which side bounds the run.
use dflash_shared::format::format_bytes;
use dflash_shared::health::QueueBound;
use dflash_shared::metrics::QueueStats;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use ratatui::Frame;

use super::chart::{self, TimeChart};
use super::theme::Theme;
use crate::app::telemetry::{Judged, AWAITING_THRESHOLDS};
use crate::app::App;
use crate::fmt;

pub fn draw(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let Some(queue) = &app.telemetry.queue else {
        let text = Span::styled("no queue readings yet", theme.dim());
        frame.render_widget(Paragraph::new(text).block(Block::bordered()), area);
        return;
    };
    if queue.capacity == 0 {
        // A one-device run computes target features and trains the drafter inline, step by
        // step: there is no queue, so an empty gauge would only look like a stall.
        let text = Span::styled(fmt::INLINE_QUEUE_NOTE, theme.dim());
        frame.render_widget(Paragraph::new(text).block(Block::bordered()), area);
        return;
    }
    let [facts, history] =
        Layout::vertical([Constraint::Length(9), Constraint::Min(0)]).areas(area);

    let bar_width = facts.width.saturating_sub(20).max(10) as usize;
    let depth_bar = depth_bar(
        queue.depth,
        queue.capacity,
        queue.low_watermark,
        queue.high_watermark,
        bar_width,
    );
    let (verdict, style) = verdict(app, theme);
    let label = |t: &'static str| Span::styled(t, theme.dim());
    let lines = vec![
        Line::from(vec![label("depth     "), Span::raw(depth_bar)]),
        Line::from(vec![
            label("          "),
            Span::raw(format!(
                "{} of {} · low watermark {} · high watermark {}",
                queue.depth, queue.capacity, queue.low_watermark, queue.high_watermark
            )),
        ]),
        Line::from(vec![
            label("resident  "),
            Span::raw(format!(
                "{} of {} cap",
                format_bytes(queue.bytes_resident),
                format_bytes(queue.byte_cap)
            )),
        ]),
        Line::from(vec![
            label("rates     "),
            Span::raw(format!(
                "producers {:.1}/s (target) · consumers {:.1}/s (drafter)",
                queue.producer_rate, queue.consumer_rate
            )),
        ]),
        Line::from(vec![
            label("waiting   "),
            Span::raw(format!(
                "producers blocked {} in all · consumers starved {} in all",
                fmt::duration_ms(queue.producer_blocked_ms as i64),
                fmt::duration_ms(queue.consumer_starved_ms as i64)
            )),
        ]),
        Line::from(vec![label("verdict   "), Span::styled(verdict, style)]),
    ];
    let block = Block::bordered().title(Line::from(title(app, theme)));
    frame.render_widget(
        Paragraph::new(lines)
            .block(block)
            .wrap(ratatui::widgets::Wrap { trim: false }),
        facts,
    );

    depth_history(frame, history, app, queue, theme);
}

/// The diagnosis of which side bounds the run, and the style that flags it.
fn verdict(app: &App, theme: &Theme) -> (String, ratatui::style::Style) {
    match app.telemetry.queue_diagnosis() {
        Judged::AwaitingThresholds => (AWAITING_THRESHOLDS.to_string(), theme.dim()),
        Judged::Verdict(None) => ("needs two samples".to_string(), theme.dim()),
        Judged::Verdict(Some(d)) => {
            let side = match d.bound {
                QueueBound::Balanced => {
                    "balanced: neither side waits much on the other".to_string()
                }
                QueueBound::TargetBound => "the TARGET side bounds the run".to_string(),
                QueueBound::DrafterBound => "the DRAFTER side bounds the run".to_string(),
            };
            let style = match d.bound {
                QueueBound::Balanced => theme.ok(),
                _ => theme.warn(),
            };
            (format!("{side} ({})", d.explanation), style)
        }
    }
}

fn title(app: &App, theme: &Theme) -> Vec<Span<'static>> {
    let mut title = vec![Span::styled(" Hidden-state queue ", theme.title())];
    if let Some(stale) = app.queue_freshness().filter(|f| f.is_stale()) {
        title.push(Span::styled(
            format!(
                "· stale {}: no reading since {} ",
                fmt::duration_ms(stale.age_ms),
                app.clock.hm(stale.last_ms)
            ),
            theme.warn(),
        ));
    }
    title
}

fn depth_history(frame: &mut Frame, area: Rect, app: &App, queue: &QueueStats, theme: &Theme) {
    TimeChart {
        block: Block::bordered().title(Span::styled(" Depth over time ", theme.title())),
        lines: vec![chart::Line {
            name: "depth".into(),
            series: &app.telemetry.queue_depth,
            style: theme.accent(),
        }],
        levels: vec![
            chart::Level {
                name: "high".into(),
                value: queue.high_watermark as f64,
                style: theme.reference_line(),
            },
            chart::Level {
                name: "low".into(),
                value: queue.low_watermark as f64,
                style: theme.dim(),
            },
        ],
        now_ms: app.now_ms,
        from_zero: true,
        format_value: |v| format!("{v:.0}"),
    }
    .draw(frame, area, theme);
}

/// `[█████░░░|░░░░░|░░]` with the watermarks marked by `|`.
fn depth_bar(depth: usize, capacity: usize, low: usize, high: usize, width: usize) -> String {
    if capacity == 0 || width < 3 {
        return format!("{depth}");
    }
    let at = |n: usize| (n.min(capacity) * width) / capacity;
    let (filled, low_at, high_at) = (at(depth), at(low), at(high));
    let mut bar = String::with_capacity(width + 2);
    bar.push('[');
    for i in 0..width {
        bar.push(if i == low_at || i == high_at {
            '|'
        } else if i < filled {
            '█'
        } else {
            '░'
        });
    }
    bar.push(']');
    bar
}

#[cfg(test)]
mod tests {
    use super::depth_bar;

    #[test]
    fn the_bar_marks_both_watermarks() {
        assert_eq!(depth_bar(5, 10, 2, 8, 10), "[██|██░░░|░]");
        assert_eq!(depth_bar(3, 0, 0, 0, 10), "3");
    }
}
