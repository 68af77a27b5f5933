//! Overview: is the run healthy at a glance? Alerts first, then throughput, progress, curves.
use dflash_shared::format::format_si;
use dflash_shared::metrics::tree_label;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Wrap};
use ratatui::Frame;

use super::acceptance;
use super::bignum;
use super::chart::{self, TimeChart};
use super::theme::Theme;
use crate::app::alerts::Explanation;
use crate::app::{wording, App};
use crate::fmt;
use dflash_shared::config::DrafterHead;
use dflash_shared::run_end::{next_steps, EndKind, RunEnding, RunSource};
use dflash_shared::status::head_name;

pub fn draw(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let inner_width = area.width.saturating_sub(2) as usize;
    let ending = app.ended();
    let mut lines = match &ending {
        Some(ending) => ending_lines(app, ending, inner_width, theme),
        None => {
            let mut lines = stale_lines(app, inner_width, theme);
            lines.extend(alert_lines(
                &app.alert_lines(),
                app.stale().is_some(),
                inner_width,
                theme,
            ));
            lines
        }
    };
    let max_rows = ((area.height as usize * 2) / 5).max(3);
    if lines.len() > max_rows {
        let hidden = lines.len() - max_rows + 1;
        lines.truncate(max_rows - 1);
        lines.push(Line::from(Span::styled(
            format!("… {hidden} more line(s); the Events view (5) has the whole journal"),
            theme.dim(),
        )));
    }
    let [alerts_area, top, bottom] = Layout::vertical([
        Constraint::Length(lines.len() as u16 + 2),
        Constraint::Length(11 + recipe_lines(app, theme).len() as u16),
        Constraint::Min(0),
    ])
    .areas(area);
    let title = match &ending {
        Some(ending) => format!(" Run {} ", ending.kind.word()),
        None => " Alerts ".into(),
    };
    let block = Block::bordered().title(Span::styled(title, theme.title()));
    frame.render_widget(Paragraph::new(lines).block(block), alerts_area);
    let [throughput, run] =
        Layout::horizontal([Constraint::Percentage(58), Constraint::Percentage(42)]).areas(top);
    draw_throughput(frame, throughput, app, theme);
    draw_run(frame, run, app, theme);
    let [loss, tau] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(bottom);
    TimeChart {
        block: Block::bordered().title(titled(" Loss", app, theme)),
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
        block: Block::bordered().title(titled(" τ (acceptance length)", app, theme)),
        lines: tau_lines(app, theme),
        levels: vec![],
        now_ms: app.now_ms,
        from_zero: false,
        format_value: |v| format!("{v:.2}"),
    }
    .draw(frame, tau, theme);
}

/// A panel title, marked "stale 14 min" while the run's figures are stale.
fn titled(title: &str, app: &App, theme: &Theme) -> Line<'static> {
    let mut spans = vec![Span::styled(format!("{title} "), theme.title())];
    if let Some(stale) = app.stale() {
        spans.push(Span::styled(
            format!("· stale {} ", fmt::duration_ms(stale.age_ms)),
            theme.warn(),
        ));
    }
    Line::from(spans)
}

/// While the run's figures are stale, the Alerts panel says so first: how long nothing came,
/// since when, and what the daemon last said, so nothing below reads as live.
fn stale_lines(app: &App, width: usize, theme: &Theme) -> Vec<Line<'static>> {
    let Some(stale) = app.stale() else {
        return Vec::new();
    };
    let what = if app.metrics_freshness().is_some() {
        "metrics line"
    } else {
        "status"
    };
    let said = match &app.status {
        Some(status) => format!(
            "; daemon last said {}",
            format!("{:?}", status.run.state).to_lowercase()
        ),
        None => String::new(),
    };
    let text = format!(
        " no data for {} (last {what} at {}{said}): every figure is from then.",
        fmt::duration_ms(stale.age_ms),
        app.clock.hm(stale.last_ms),
    );
    vec![Line::from(vec![
        Span::styled("STALE", theme.warn()),
        Span::raw(fit(&text, width.saturating_sub(5))),
    ])]
}

/// Offline τ and the offline tree τ at the serving budget ("offline tree@32"), and beside them
/// online chain τ and the online tree τ at the serving budget ("online tree@32"; every budget
/// where the serving one is unknown) once an online evaluation has run. The legend names them;
/// with offline τ alone there is none.
fn tau_lines<'a>(app: &'a App, theme: &Theme) -> Vec<chart::Line<'a>> {
    let t = &app.telemetry;
    let mut lines = vec![chart::Line {
        name: "offline".into(),
        series: &t.tau,
        style: theme.accent(),
    }];
    for (budget, series) in &t.offline_tree {
        lines.push(chart::Line {
            name: format!("offline {}", tree_label(*budget)),
            series,
            style: theme.warn(),
        });
    }
    if t.online_chain.iter().next().is_some() {
        lines.push(chart::Line {
            name: "online chain".into(),
            series: &t.online_chain,
            style: theme.ok(),
        });
        // The serving budget's tree alone where it is known, so the legend stays small enough
        // to be drawn; the other budgets are in `dflash-tui status`.
        let serve = t
            .online_serve_budget
            .filter(|b| t.online_ddtree.contains_key(b));
        for (budget, series) in &t.online_ddtree {
            let name = match serve {
                Some(serve) if serve == *budget => format!("online {}", tree_label(*budget)),
                Some(_) => continue,
                None => format!("online ddtree_{budget}"),
            };
            lines.push(chart::Line {
                name,
                series,
                style: theme.text(),
            });
        }
    }
    lines
}

/// The newest online evaluation, two rows: "online  chain 2.50 · tree@32 3.10" (the tree τ at
/// the serving budget; every method where that budget is unknown) and "gap 29% below offline
/// 3.50 (step 1,200)". The gap is in the warning style once it exceeds the
/// daemon's serve-gap threshold.
fn online_lines(app: &App, theme: &Theme) -> Vec<Line<'static>> {
    let Some(online) = app.last_online() else {
        return Vec::new();
    };
    let a = &online.acceptance;
    let label = |text: &'static str| Span::styled(text, theme.dim());
    let step = fmt::thousands(online.step);
    let mut lines = vec![Line::from(vec![
        label("online  "),
        Span::raw(acceptance::online_words(a)),
    ])];
    let (gap, style) = match (a.gap_fraction(), a.offline_tau) {
        (Some(gap), Some(offline)) => {
            let limit = app.telemetry.thresholds().map(|d| d.serve_gap.gap_fraction);
            let style = if limit.is_some_and(|l| gap > l) {
                theme.warn()
            } else {
                theme.text()
            };
            let words = if gap > 0.0 {
                format!(
                    "{:.0}% below offline {offline:.2} (step {step})",
                    100.0 * gap
                )
            } else {
                format!("at or above offline {offline:.2} (step {step})")
            };
            (words, style)
        }
        _ => (
            format!("no offline τ of the same moment (step {step})"),
            theme.dim(),
        ),
    };
    lines.push(Line::from(vec![
        label("gap     "),
        Span::styled(gap, style),
    ]));
    lines
}

/// The run has ended: how, where it left its last checkpoint, the figures it ended on, and the
/// commands for what comes next.
fn ending_lines(app: &App, ending: &RunEnding, width: usize, theme: &Theme) -> Vec<Line<'static>> {
    let style = match ending.kind {
        EndKind::Finished => theme.ok(),
        EndKind::Stopped => theme.warn(),
        EndKind::Failed => theme.crit(),
    };
    let mut lines = vec![Line::from(Span::styled(
        fit(
            &format!(
                "Run {}: {} ({})",
                ending.kind.word(),
                ending.reason,
                app.clock.month_day_hm(ending.at_ms)
            ),
            width,
        ),
        style,
    ))];
    let status = app.status.as_ref();
    // The last metrics line is the run's last word; the last status may predate it.
    let last = app.telemetry.last_metrics.as_ref();
    let step = last.map(|m| m.step).or(status.map(|s| s.run.step));
    let loss = last.map(|m| m.loss).or(status.and_then(|s| s.last_loss));
    let figures = format!(
        "final: step {}, loss {}; checkpoint {}",
        step.map_or("—".into(), fmt::thousands),
        loss.map_or("—".into(), |l| format!("{l:.3}")),
        ending.checkpoint.as_deref().unwrap_or("none")
    );
    lines.push(Line::from(fit(&figures, width)));
    if let Some(tau) = acceptance::ending_words(app) {
        lines.push(Line::from(fit(&tau, width)));
    }
    let run_dir = status.map_or("RUN_DIR".to_string(), |s| s.run.run_dir.clone());
    // A daemon started without a config trained the embedded default: its target and held-out
    // prompts have paths the evaluate line can name.
    let source = match status {
        Some(s) if s.run.config_path.is_none() => RunSource::EmbeddedDefault,
        _ => RunSource::ConfigOrUnknown,
    };
    for step in next_steps(ending, &run_dir, source) {
        lines.push(Line::from(Span::styled(
            fit(&format!("next: {step}"), width),
            theme.dim(),
        )));
    }
    lines
}

/// One line per alert, most severe first; the worst alert also lists what changed before it.
/// Lines are cut to the width (keeping a trailing "at 21:00") rather than wrapped, so a long
/// explanation never pushes the other alerts off the screen.
fn alert_lines(
    alerts: &[Explanation],
    stale: bool,
    width: usize,
    theme: &Theme,
) -> Vec<Line<'static>> {
    if alerts.is_empty() && stale {
        return vec![Line::from(Span::styled(
            "No alert from the data there is; that says nothing about now.",
            theme.dim(),
        ))];
    }
    if alerts.is_empty() {
        return vec![Line::from(Span::styled("No active alerts.", theme.ok()))];
    }
    let mut lines = Vec::new();
    for (i, alert) in alerts.iter().enumerate() {
        let tag = format!("{:<5}", wording::severity_word(alert.level).to_uppercase());
        let head = if i == 0 && !alert.before.is_empty() {
            format!("{}. Before it:", alert.head)
        } else if i == 0 {
            format!(
                "{}. Nothing changed in the journal in the hour before.",
                alert.head
            )
        } else {
            alert.head.clone()
        };
        lines.push(Line::from(vec![
            Span::styled(tag, theme.severity(alert.level)),
            Span::raw(fit(&head, width.saturating_sub(5))),
        ]));
        if i == 0 {
            for before in &alert.before {
                lines.push(Line::from(vec![
                    Span::styled("     · ", theme.dim()),
                    Span::raw(fit(before, width.saturating_sub(7))),
                ]));
            }
        }
    }
    lines
}

/// Cuts `text` to `width` columns with an ellipsis, keeping a trailing " at HH:MM".
fn fit(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let (body, time) = match text.rfind(" at ") {
        Some(at) if text.len() - at == " at HH:MM".len() => text.split_at(at),
        _ => (text, ""),
    };
    let keep = width.saturating_sub(time.chars().count() + 1);
    let cut: String = body.chars().take(keep).collect();
    format!("{cut}…{time}")
}

fn draw_throughput(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let block = Block::bordered().title(titled(" Throughput (tok/s)", app, theme));
    let stale = app.stale();
    let inner = block.inner(area);
    frame.render_widget(block, area);

    let tokens = app.tokens_per_s();
    let headline = tokens.map_or_else(|| "—".to_string(), format_si);
    let style = match (stale, app.worst_alert()) {
        (Some(_), _) => theme.dim(),
        (None, Some(level)) => theme.severity(level),
        (None, None) => theme.ok(),
    };
    let big_lines: Vec<Line> = match bignum::render(&headline) {
        Some(rows) => rows
            .into_iter()
            .map(|r| Line::from(Span::styled(format!(" {r}"), style)))
            .collect(),
        None => vec![Line::from(Span::styled(format!(" {headline}"), style))],
    };
    let baseline_lines = baseline_lines(app, theme, style);
    let [big, baseline, history] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Length(baseline_lines.len() as u16),
        Constraint::Min(0),
    ])
    .areas(inner);
    frame.render_widget(Paragraph::new(big_lines), big);
    frame.render_widget(Paragraph::new(baseline_lines), baseline);

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
        format_value: format_si,
    }
    .draw(frame, history, theme);
}

/// Beneath the big number: the baseline and the share of it, how long the run has been
/// stable; on a second line, only when there is something to say, the healthy record's clock,
/// the draft rate and MFU.
fn baseline_lines(app: &App, theme: &Theme, style: Style) -> Vec<Line<'static>> {
    let stale = app.stale();
    let mut spans = Vec::new();
    match (app.tokens_per_s(), app.baseline_tokens_per_s()) {
        // A stale figure is no share of baseline: it says when it was true.
        (Some(_), base) if stale.is_some() => {
            let stale = stale.expect("matched");
            spans.push(Span::styled(
                format!(
                    " stale {}: last sample at {}",
                    fmt::duration_ms(stale.age_ms),
                    app.clock.hm(stale.last_ms)
                ),
                theme.warn(),
            ));
            if let Some(base) = base {
                spans.push(Span::raw(format!(" · baseline {}", format_si(base))));
            }
        }
        (Some(now), Some(base)) if base > 0.0 => {
            spans.push(Span::raw(format!(" baseline {} · ", format_si(base))));
            spans.push(Span::styled(
                format!("{:.0}% of baseline", 100.0 * now / base),
                style,
            ));
        }
        (_, Some(base)) => spans.push(Span::raw(format!(" baseline {}", format_si(base)))),
        (_, None) => spans.push(Span::styled(" baseline: not yet established", theme.dim())),
    }
    // "Stable" only while it is live and no throughput alert says otherwise.
    let throughput_alert = app
        .shown_alerts()
        .iter()
        .any(|(a, _)| crate::app::alerts::is_throughput_detector(&a.detector));
    let mut second = Vec::new();
    if stale.is_none() && !throughput_alert && !app.status_is_old() {
        spans.extend(stable_for_span(app));
        second.extend(record_clock_span(app, theme));
    }
    if let Some((positions, mfu)) = app.draft_rate().filter(|(p, _)| *p > 0.0) {
        let lead = if second.is_empty() { " " } else { " · " };
        second.push(Span::raw(format!(
            "{lead}{} draft pos/s",
            format_si(positions)
        )));
        second.push(match mfu {
            Some(m) => Span::raw(format!(" · MFU {:.1}%", 100.0 * m)),
            None => Span::styled(" · MFU —", theme.dim()),
        });
    }
    let mut lines = vec![Line::from(spans)];
    if !second.is_empty() {
        lines.push(Line::from(second));
    }
    lines
}

/// " · stable for 3 min": since when the run has been healthy without a break (the healthy
/// record's stretch, where the daemon keeps a record).
fn stable_for_span(app: &App) -> Option<Span<'static>> {
    let since = app.status.as_ref()?.throughput.stable_since_ms?;
    Some(Span::raw(format!(
        " · stable for {}",
        fmt::duration_ms(app.now_ms - since)
    )))
}

/// " healthy record in 2 min": what the healthy record's clock will do next. A dip being timed
/// holds the clock without feeding the record, and says so.
fn record_clock_span(app: &App, theme: &Theme) -> Option<Span<'static>> {
    let clock = app.status.as_ref()?.throughput.record_clock.as_ref()?;
    if clock.drop_timed {
        return Some(Span::styled(" a dip is being timed", theme.warn()));
    }
    if let Some(due) = clock.due_ms {
        return Some(Span::raw(if due > app.now_ms {
            format!(" healthy record in {}", fmt::duration_ms(due - app.now_ms))
        } else {
            " healthy record due".to_string()
        }));
    }
    let written = clock.written_ms?;
    Some(Span::styled(
        format!(" healthy record written {}", app.clock.hm(written)),
        theme.dim(),
    ))
}

fn draw_run(frame: &mut Frame, area: Rect, app: &App, theme: &Theme) {
    let block = Block::bordered().title(titled(" Run", app, theme));
    let stale = app.stale();
    let mut lines = Vec::new();
    let label = |text: &'static str| Span::styled(text, theme.dim());
    match &app.status {
        Some(status) => {
            let run = &status.run;
            let state = match app.ended() {
                Some(ending) => format!("{} (dflashd has exited)", ending.kind.word()),
                None => format!("{:?}", run.state),
            };
            lines.push(Line::from(vec![label("state   "), Span::raw(state)]));
            lines.extend(recipe_lines(app, theme));
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
                _ if app.ended().is_none() && stale.is_some() => format!(
                    "unknown: no step for {}",
                    fmt::duration_ms(stale.map_or(0, |s| s.age_ms))
                ),
                Some(eta) => format!(
                    "epoch {} ends in {} ({})",
                    run.epochs,
                    fmt::duration_ms(eta - app.now_ms),
                    app.clock.month_day_hm(eta)
                ),
                None if app.ended().is_some() => "— (the run has ended)".into(),
                None => "unknown until steps are measured".into(),
            };
            lines.push(Line::from(vec![label("ETA     "), Span::raw(eta)]));
            let loss = status.last_loss.map_or("—".into(), |l| format!("{l:.3}"));
            let tau = acceptance::held_out_words(status.last_tau, status.last_tau_tree.as_ref());
            lines.push(Line::from(vec![
                label("loss    "),
                Span::raw(format!("{loss}   {tau}")),
            ]));
            lines.extend(online_lines(app, theme));
            let checkpoint = status
                .checkpoints
                .iter()
                .max_by_key(|c| c.step)
                .map(|c| (c.step, c.written_ms));
            // The final save comes after the last status a console can get from a daemon that
            // then exits; the journal's ending names it.
            let final_save = app.ended().and_then(|e| {
                let step = e.checkpoint.as_deref().and_then(checkpoint_step)?;
                Some((step, e.at_ms))
            });
            let newest = match (checkpoint, final_save) {
                (Some(c), Some(f)) => Some(if f.0 > c.0 { f } else { c }),
                (c, f) => c.or(f),
            };
            lines.push(Line::from(vec![
                label("saved   "),
                Span::raw(match newest {
                    Some((step, written_ms)) => format!(
                        "step {} · {} ago",
                        fmt::thousands(step),
                        fmt::duration_ms(app.now_ms - written_ms)
                    ),
                    None => "no checkpoint yet".into(),
                }),
            ]));
            lines.extend(best_line(status, theme));
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
        None => lines.push(Line::from(Span::styled(
            "waiting for the daemon's status…",
            theme.dim(),
        ))),
    }
    frame.render_widget(
        Paragraph::new(lines).block(block).wrap(Wrap { trim: true }),
        area,
    );
}

/// The run's best checkpoint: "best    step 450 · tree τ@32 4.45", or why there is none;
/// nothing from a daemon that says neither.
fn best_line(
    status: &dflash_shared::status::StatusSnapshot,
    theme: &Theme,
) -> Option<Line<'static>> {
    let words = match (&status.best_checkpoint, &status.no_best_checkpoint) {
        (Some(best), _) => format!(
            "step {} · tree τ@{} {:.2}",
            fmt::thousands(best.step),
            best.budget,
            best.tau_tree
        ),
        (None, Some(why)) => format!("none, {}", why.words()),
        (None, None) => return None,
    };
    Some(Line::from(vec![
        Span::styled("best    ", theme.dim()),
        Span::raw(words),
    ]))
}

/// What the run trains: "objective D-PACE (α 0.5), Domino head" and, for a Domino head, its
/// newest training-batch acceptance "accept  base 2.31 → final 2.87 (+0.56)" (the metrics'
/// `base_accept_len` and `accept_len`, teacher-forced) and, once an online evaluation has run,
/// the served pair "online  chain base 2.10 → 2.50 (+0.40)" (`online_base_tau_chain` →
/// `online_tau_chain`). Nothing before the first status.
fn recipe_lines(app: &App, theme: &Theme) -> Vec<Line<'static>> {
    let Some(status) = &app.status else {
        return Vec::new();
    };
    let run = &status.run;
    // A DSpark head trains its own loss whatever `training.objective` says (validation keeps
    // that at "dflash"), so the panel names the loss it trains.
    let objective = match (run.drafter_head, run.objective.as_ref()) {
        (Some(DrafterHead::Dspark), _) => "DSpark distillation".into(),
        (_, Some(objective)) => objective.words(),
        (_, None) => "unknown (not reported)".to_string(),
    };
    let head = run
        .drafter_head
        .map_or(String::new(), |h| format!(", {} head", head_name(h)));
    let mut lines = vec![Line::from(vec![
        Span::styled("objective ", theme.dim()),
        Span::raw(format!("{objective}{head}")),
    ])];
    // A node of a multi-node job: which node, the job's rate (what the big number and the
    // detector judge) and the node that holds the job back.
    if let Some(job) = &status.job {
        lines.push(Line::from(vec![
            Span::styled("job     ", theme.dim()),
            Span::raw(job.place_and_rate()),
        ]));
        if let Some(behind) = job.behind() {
            lines.push(Line::from(vec![
                Span::styled("behind  ", theme.dim()),
                Span::raw(behind),
            ]));
        }
    }
    if let Some(domino) = app.last_domino() {
        lines.push(Line::from(vec![
            Span::styled("accept  ", theme.dim()),
            Span::raw(domino.short_words()),
        ]));
    }
    if let Some(dspark) = app.last_dspark() {
        lines.push(Line::from(vec![
            Span::styled("accept  ", theme.dim()),
            Span::raw(dspark.acceptance_words()),
        ]));
        lines.push(Line::from(vec![
            Span::styled("confid. ", theme.dim()),
            Span::raw(dspark.calibration_words()),
        ]));
    }
    if let Some(dflash2) = app.last_dflash2() {
        lines.push(Line::from(vec![
            Span::styled("accept  ", theme.dim()),
            Span::raw(dflash2.acceptance_words()),
        ]));
        lines.push(Line::from(vec![
            Span::styled("select  ", theme.dim()),
            Span::raw(dflash2.reach_words()),
        ]));
    }
    // The same pair served: the newest online evaluation's chain τ from the LM head alone and
    // with the correction. Its own row, so the teacher-forced batch figures above keep theirs.
    if let Some((base, last)) = app.last_online().and_then(|o| {
        let a = &o.acceptance;
        a.base.as_ref().map(|b| (b.tau_chain, a.tau_chain))
    }) {
        lines.push(Line::from(vec![
            Span::styled("online  ", theme.dim()),
            Span::raw(online_base_words(base, last)),
        ]));
    }
    lines
}

/// "chain base 2.10 → 2.50 (+0.40)": the correction is the difference of the two rounded
/// figures, so the row adds up (as the batch row's does).
fn online_base_words(base: f64, last: f64) -> String {
    let round = |x: f64| (x * 100.0).round() / 100.0;
    let (base, last) = (round(base), round(last));
    format!("chain base {base:.2} → {last:.2} ({:+.2})", last - base)
}

/// The step of a checkpoint directory named `…/step-0000000642`.
fn checkpoint_step(path: &str) -> Option<u64> {
    let name = path.trim_end_matches('/').rsplit('/').next()?;
    name.strip_prefix("step-")?.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn checkpoint_steps_are_read_from_the_directory_name() {
        assert_eq!(
            super::checkpoint_step("/r/checkpoints/step-0000000642"),
            Some(642)
        );
        assert_eq!(super::checkpoint_step("/r/checkpoints/step-12/"), Some(12));
        assert_eq!(
            super::checkpoint_step("/r/checkpoints/corrupt-step-7"),
            None
        );
    }

    use super::fit;

    #[test]
    fn long_lines_keep_their_time() {
        assert_eq!(fit("short", 10), "short");
        assert_eq!(
            fit("a very long explanation at 21:02", 20),
            "a very lon… at 21:02"
        );
        assert_eq!(fit("no time in this long line", 10), "no time i…");
    }
}
