//! Time-series charts whose x axis ends at "now" and whose window grows with the data; a line
//! breaks where its samples stopped for longer than the staleness threshold.
use dflash_shared::metrics::TimestampMs;
use ratatui::layout::Rect;
use ratatui::style::Style;
use ratatui::symbols::Marker;
use ratatui::text::Span;
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType, Paragraph};
use ratatui::Frame;

use super::theme::Theme;
use crate::app::freshness;
use crate::app::history::Series;
use crate::fmt;

const MIN_WINDOW_MS: i64 = 5 * 60 * 1000;

pub struct Line<'a> {
    pub name: String,
    pub series: &'a Series,
    pub style: Style,
}

/// A horizontal line across the chart (a baseline, a watermark).
pub struct Level {
    pub name: String,
    pub value: f64,
    pub style: Style,
}

pub struct TimeChart<'a> {
    pub block: Block<'a>,
    pub lines: Vec<Line<'a>>,
    pub levels: Vec<Level>,
    pub now_ms: TimestampMs,
    pub from_zero: bool,
    pub format_value: fn(f64) -> String,
}

impl TimeChart<'_> {
    pub fn draw(self, frame: &mut Frame, area: Rect, theme: &Theme) {
        let oldest = self
            .lines
            .iter()
            .filter_map(|l| l.series.iter().next().map(|p| p.0))
            .min();
        let Some(oldest) = oldest else {
            let empty = Paragraph::new(Span::styled("no data yet", theme.dim())).block(self.block);
            frame.render_widget(empty, area);
            return;
        };
        let window_ms = (self.now_ms - oldest).max(MIN_WINDOW_MS);
        let window_s = window_ms as f64 / 1000.0;

        let data: Vec<Vec<(f64, f64)>> = self
            .lines
            .iter()
            .map(|l| {
                l.series
                    .since(self.now_ms - window_ms)
                    .map(|&(ts, v)| ((ts - self.now_ms) as f64 / 1000.0, v))
                    .collect()
            })
            .collect();
        let level_data: Vec<Vec<(f64, f64)>> = self
            .levels
            .iter()
            .map(|l| vec![(-window_s, l.value), (0.0, l.value)])
            .collect();

        let values = data
            .iter()
            .flatten()
            .map(|p| p.1)
            .chain(self.levels.iter().map(|l| l.value));
        let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let (lo, hi) = if self.from_zero {
            (0.0_f64.min(lo), hi)
        } else {
            (lo, hi)
        };
        let pad = ((hi - lo).abs() * 0.1).max(hi.abs() * 0.01).max(1e-9);
        let (y_lo, y_hi) = (if self.from_zero { lo } else { lo - pad }, hi + pad);
        // The padding never takes an axis of non-negative figures (a loss, a rate, τ) below
        // zero, where its label would read as a negative value.
        let y_lo = if lo >= 0.0 { y_lo.max(0.0) } else { y_lo };

        let mut datasets = Vec::new();
        for (level, points) in self.levels.iter().zip(&level_data) {
            datasets.push(
                Dataset::default()
                    .name(level.name.clone())
                    .marker(Marker::Braille)
                    .graph_type(GraphType::Line)
                    .style(level.style)
                    .data(points),
            );
        }
        // Samples further apart than the series' staleness threshold are not joined: the line
        // stops at the last sample before a gap and starts again after it (`app::freshness`).
        for (line, points) in self.lines.iter().zip(&data) {
            let gap_s = freshness::series_threshold_ms(line.series) as f64 / 1000.0;
            for (i, piece) in freshness::split_at_gaps(points, gap_s)
                .into_iter()
                .enumerate()
            {
                let mut dataset = Dataset::default()
                    .marker(Marker::Braille)
                    .graph_type(if piece.len() == 1 {
                        GraphType::Scatter
                    } else {
                        GraphType::Line
                    })
                    .style(line.style)
                    .data(piece);
                if i == 0 {
                    dataset = dataset.name(line.name.clone());
                }
                datasets.push(dataset);
            }
        }
        let x_labels = vec![
            Span::styled(format!("-{}", fmt::duration_ms(window_ms)), theme.dim()),
            Span::styled("now", theme.dim()),
        ];
        let y_labels = vec![
            Span::styled((self.format_value)(y_lo), theme.dim()),
            Span::styled((self.format_value)(y_hi), theme.dim()),
        ];
        let legend = (self.lines.len() + self.levels.len() > 1)
            .then_some(ratatui::widgets::LegendPosition::TopLeft);
        let chart = Chart::new(datasets)
            .legend_position(legend)
            .block(self.block)
            .x_axis(Axis::default().bounds([-window_s, 0.0]).labels(x_labels))
            .y_axis(Axis::default().bounds([y_lo, y_hi]).labels(y_labels))
            .hidden_legend_constraints((
                ratatui::layout::Constraint::Percentage(60),
                ratatui::layout::Constraint::Percentage(60),
            ));
        frame.render_widget(chart, area);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::history::Series;
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    /// The chart of `values`, one a second up to `now`, as text.
    fn rendered(values: &[f64]) -> String {
        let now = 1_000_000;
        let mut series = Series::new(1000, 3_600_000);
        for (i, &v) in values.iter().enumerate() {
            series.push(now - (values.len() - i) as i64 * 1000, v);
        }
        let mut terminal = Terminal::new(TestBackend::new(60, 12)).unwrap();
        let theme = Theme::plain();
        terminal
            .draw(|frame| {
                TimeChart {
                    block: Block::bordered(),
                    lines: vec![Line {
                        name: "loss".into(),
                        series: &series,
                        style: Style::default(),
                    }],
                    levels: vec![],
                    now_ms: now,
                    from_zero: false,
                    format_value: |v| format!("{v:.3}"),
                }
                .draw(frame, frame.area(), &theme)
            })
            .unwrap();
        let buffer = terminal.backend().buffer();
        buffer.content().iter().map(|c| c.symbol()).collect()
    }

    #[test]
    fn an_axis_of_non_negative_values_does_not_run_below_zero() {
        // A loss falling from 4.8 to 0.05: a 10 % pad below would label the axis -0.425.
        let falling: Vec<f64> = (0..40).map(|i| 4.8 * 0.9_f64.powi(i) + 0.05).collect();
        let text = rendered(&falling);
        assert!(text.contains("0.000"), "{text}");
        assert!(!text.contains("-0."), "{text}");
        // Values below zero keep their padding.
        let text = rendered(&[-1.0, 1.0]);
        assert!(text.contains("-1.2"), "{text}");
    }
}
