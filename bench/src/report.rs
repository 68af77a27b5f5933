//! The results of one benchmark run: the machine, every case, the one-line summary and the
//! Markdown tables `docs/BENCHMARKS.md` is built from.
use std::fmt::Write as _;
use std::fs;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::compare::StepComparison;
use super::harness::{AttentionResult, OverheadResult, ParityResult, TargetResult};
use super::matmul::MatmulPeak;
use super::memory::parse_status_kb;
use super::queue::QueueRun;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub nproc: usize,
    pub cpu_model: String,
    pub mem_total_gb: f64,
    /// 1-minute load average when the run started and ended (these machines are shared).
    pub loadavg_start: Option<f64>,
    pub loadavg_end: Option<f64>,
    pub threads: i32,
}

pub fn loadavg() -> Option<f64> {
    fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl Machine {
    pub fn probe(threads: i32) -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .and_then(|r| r.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let meminfo = fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Self {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model,
            mem_total_gb: parse_status_kb(&meminfo, "MemTotal").map_or(0.0, |kb| kb * 1024.0 / 1e9),
            loadavg_start: loadavg(),
            loadavg_end: None,
            threads,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchReport {
    pub command: String,
    pub machine: Machine,
    pub matmul_peak: Option<MatmulPeak>,
    pub steps: Vec<StepComparison>,
    pub attention: Vec<AttentionResult>,
    pub target: Option<TargetResult>,
    pub parity: Option<ParityResult>,
    pub overhead: Option<OverheadResult>,
    pub queue: Option<QueueRun>,
    pub plan: Option<crate::plan_check::PlanCheck>,
    /// `--cases objectives`: the objective tournament, one per data set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objectives: Vec<crate::objectives::ObjectivesResult>,
    /// Cases that failed outright, with the error.
    pub errors: Vec<String>,
    /// Cases the harness does not run, and why.
    pub not_done: Vec<String>,
}

fn num(x: Option<f64>) -> Value {
    x.filter(|v| v.is_finite())
        .map_or(Value::Null, |v| json!((v * 1000.0).round() / 1000.0))
}

impl BenchReport {
    /// The one-line summary (the last stdout line): the first step comparison's figures.
    pub fn summary(&self) -> Value {
        let mut s = json!({ "threads": self.machine.threads, "loadavg_start": num(self.machine.loadavg_start), "loadavg_end": num(self.machine.loadavg_end) });
        let obj = s.as_object_mut().expect("an object");
        if let Some(c) = self.steps.first() {
            for (k, v) in [
                ("config", json!(c.config)),
                ("engine_step_ms", num(c.engine.median_step_ms)),
                ("reference_step_ms", num(c.reference.median_step_ms)),
                ("ratio", num(c.ratio)),
                ("engine_cpu_ms", num(c.engine.median_cpu_ms)),
                ("reference_cpu_ms", num(c.reference.median_cpu_ms)),
                ("cpu_ratio", num(c.cpu_ratio)),
                ("engine_peak_rss_mb", num(c.engine.peak_rss_mb)),
                ("reference_peak_rss_mb", num(c.reference.peak_rss_mb)),
                ("engine_step_growth_mb", num(c.engine.step_growth_mb())),
                (
                    "reference_step_growth_mb",
                    num(c.reference.step_growth_mb()),
                ),
                ("engine_live_step_mb", num(c.engine.live_step_mb)),
                ("reference_live_step_mb", num(c.reference.live_step_mb)),
                ("live_step_ratio", num(c.live_step_ratio)),
                ("engine_tokens_per_s", num(c.engine_tokens_per_s)),
                ("reference_tokens_per_s", num(c.reference_tokens_per_s)),
                ("engine_loss", num(c.check.engine_loss)),
                ("reference_loss", num(c.check.reference_loss)),
                (
                    "loss_rel_diff",
                    c.check.rel_diff.map_or(Value::Null, |d| json!(d)),
                ),
                (
                    "comparison",
                    json!(if c.check.valid {
                        "valid".to_string()
                    } else {
                        format!("void: {}", c.check.void_reason.clone().unwrap_or_default())
                    }),
                ),
                ("engine_gflops", num(c.engine_gflops)),
                (
                    "engine_fraction_of_matmul_peak",
                    num(c.engine_fraction_of_matmul_peak),
                ),
            ] {
                obj.insert(k.into(), v);
            }
        }
        obj.insert(
            "matmul_peak_gflops".into(),
            num(self.matmul_peak.as_ref().and_then(|p| p.gflops)),
        );
        obj.insert("errors".into(), json!(self.errors));
        s
    }

    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let m = &self.machine;
        let _ = writeln!(md, "Command: `{}`\n", self.command);
        let _ = writeln!(
            md,
            "Machine: {} × {} (nproc {}), {:.1} GB RAM; {} intra-op threads per process; load average {} at start, {} at end.\n",
            m.nproc,
            m.cpu_model,
            m.nproc,
            m.mem_total_gb,
            m.threads,
            fmt(m.loadavg_start, 1),
            fmt(m.loadavg_end, 1)
        );
        if let Some(p) = &self.matmul_peak {
            let _ = writeln!(
                md,
                "Matmul peak ({} {}×{} `mm`, median of {}): **{} GFLOP/s**.\n",
                p.dtype,
                p.n,
                p.n,
                p.step_ms.len(),
                fmt(p.gflops, 1)
            );
        }
        if !self.steps.is_empty() {
            md.push_str(&step_table(&self.steps));
        }
        if !self.attention.is_empty() {
            md.push_str(&attention_table(&self.attention));
        }
        if let Some(t) = &self.target {
            md.push_str(&target_table(t));
        }
        if let Some(o) = &self.overhead {
            md.push_str(&overhead_table(o));
        }
        if let Some(q) = &self.queue {
            md.push_str(&queue_table(q));
        }
        for o in &self.objectives {
            md.push_str(&crate::objectives::markdown::render(o));
        }
        for e in &self.errors {
            let _ = writeln!(md, "- error: {e}");
        }
        for n in &self.not_done {
            let _ = writeln!(md, "- not done: {n}");
        }
        md
    }
}

pub fn fmt(x: Option<f64>, digits: usize) -> String {
    x.filter(|v| v.is_finite())
        .map_or_else(|| "–".into(), |v| format!("{v:.digits$}"))
}

fn step_table(steps: &[StepComparison]) -> String {
    let mut md = String::from(
        "### Drafter training step (forward, backward, AdamW)\n\n\
         | config | B×S, anchors×bs | engine ms | reference ms | ratio | CPU-time ratio | engine tok/s | reference tok/s | engine peak / step growth MiB | reference peak / step growth MiB | live step MiB engine / reference (ratio) | engine GFLOP/s (of peak) | loss engine / reference (rel diff) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for c in steps {
        let m = &c.meta;
        let check = if c.check.valid {
            format!(
                "{} / {} ({:.1e})",
                fmt(c.check.engine_loss, 5),
                fmt(c.check.reference_loss, 5),
                c.check.rel_diff.unwrap_or(0.0)
            )
        } else {
            format!(
                "**void**: {}",
                c.check.void_reason.clone().unwrap_or_default()
            )
        };
        let _ = writeln!(
            md,
            "| {} | {}×{}, {}×{} | {} | {} | **{}** | {} | {} | {} | {} / {} | {} / {} | {} / {} (**{}**) | {} ({}%) | {} |",
            c.config,
            m.batch,
            m.seq_len,
            m.num_blocks,
            m.block_size,
            fmt(c.engine.median_step_ms, 1),
            fmt(c.reference.median_step_ms, 1),
            fmt(c.ratio, 2),
            fmt(c.cpu_ratio, 2),
            fmt(c.engine_tokens_per_s, 0),
            fmt(c.reference_tokens_per_s, 0),
            fmt(c.engine.peak_rss_mb, 0),
            fmt(c.engine.step_growth_mb(), 0),
            fmt(c.reference.peak_rss_mb, 0),
            fmt(c.reference.step_growth_mb(), 0),
            fmt(c.engine.live_step_mb, 1),
            fmt(c.reference.live_step_mb, 1),
            fmt(c.live_step_ratio, 2),
            fmt(c.engine_gflops, 1),
            fmt(c.engine_fraction_of_matmul_peak.map(|f| f * 100.0), 1),
            check
        );
    }
    md.push('\n');
    md
}

fn attention_table(results: &[AttentionResult]) -> String {
    let mut md = String::from(
        "### Attention: block-sparse vs dense mask (forward + backward; flex: forward only)\n\n\
         | anchors × bs, context | implementation | median ms | median CPU ms | peak / step growth MiB | max abs diff vs block-sparse |\n\
         |---|---|---|---|---|---|\n",
    );
    for r in results {
        let m = &r.meta;
        let shape = format!(
            "{}×{}, {} (heads {}/{}, dim {})",
            m.anchors, m.block_size, m.context_len, m.heads, m.kv_heads, m.head_dim
        );
        for run in &r.runs {
            let row = match &run.error {
                Some(e) => format!(
                    "| {shape} | {} | failed: {} | | | |",
                    run.implementation,
                    e.replace('|', "/")
                ),
                None => format!(
                    "| {shape} | {} | {} | {} | {} / {} | {} |",
                    run.implementation,
                    fmt(run.median_step_ms, 1),
                    fmt(run.median_cpu_ms, 1),
                    fmt(run.peak_rss_mb, 0),
                    fmt(run.step_growth_mb(), 0),
                    run.max_abs_diff.map_or("–".into(), |d| format!("{d:.1e}"))
                ),
            };
            let _ = writeln!(md, "{row}");
        }
        for (name, why) in &r.skipped {
            let _ = writeln!(md, "| {shape} | {name} | {why} | | | |");
        }
        if let (Some(p), Some(t)) = (r.dense_over_sparse_peak, r.dense_over_sparse_time) {
            let _ = writeln!(md, "| {shape} | **dense / block-sparse** | **{t:.2}× time** | | **{p:.1}× step growth** | |");
        }
    }
    md.push('\n');
    md
}

fn target_table(t: &TargetResult) -> String {
    let m = &t.meta;
    let mut md = format!(
        "### Target feature pass (Qwen3.5 hybrid: hidden {}, {} layers, vocab {}, taps {:?}; B×S = {}×{})\n\n\
         | implementation | median ms | median CPU ms | tok/s | peak / step growth MiB | max abs diff (rel L2) vs engine |\n|---|---|---|---|---|---|\n",
        m.hidden_size, m.num_layers, m.vocab_size, m.layer_ids, m.batch, m.seq_len
    );
    let tokens = (m.batch * m.seq_len) as f64;
    for run in [&t.engine, &t.transformers] {
        match &run.error {
            Some(e) => {
                let _ = writeln!(
                    md,
                    "| {} | failed: {} | | | | |",
                    run.implementation,
                    e.replace('|', "/")
                );
            }
            None => {
                let tps = run.median_step_ms.map(|ms| tokens / (ms * 1e-3));
                let diff = run.max_abs_diff.map_or("–".into(), |d| {
                    format!("{d:.1e} ({:.1e})", run.rel_l2_diff.unwrap_or(0.0))
                });
                let _ = writeln!(
                    md,
                    "| {} | {} | {} | {} | {} / {} | {} |",
                    run.implementation,
                    fmt(run.median_step_ms, 1),
                    fmt(run.median_cpu_ms, 1),
                    fmt(tps, 0),
                    fmt(run.peak_rss_mb, 0),
                    fmt(run.step_growth_mb(), 0),
                    diff
                );
            }
        }
    }
    let _ = writeln!(
        md,
        "\nengine / transformers: time ratio **{}**, peak RSS ratio {}.\n",
        fmt(t.ratio, 2),
        fmt(t.peak_rss_ratio, 2)
    );
    md
}

fn pct(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{:+.1}%", v * 100.0))
}

fn overhead_table(o: &OverheadResult) -> String {
    let mut md = String::from(
        "### Daemon overhead (embedded default step + metrics published to the bus)\n\n\
         | clients | telemetry sampler | median step ms | vs 0 clients, no sampler | median training-thread CPU ms | vs 0 clients, no sampler (CPU) | median publish µs | steps |\n|---|---|---|---|---|---|---|---|\n",
    );
    let overheads = [
        Some(0.0),
        o.clients_overhead,
        o.sampler_overhead,
        o.both_overhead,
    ];
    let cpu_overheads = [
        Some(0.0),
        o.clients_cpu_overhead,
        o.sampler_cpu_overhead,
        o.both_cpu_overhead,
    ];
    for ((run, over), cpu_over) in o.runs.iter().zip(overheads).zip(cpu_overheads) {
        let note = run.error.as_ref().map_or(String::new(), |e| {
            format!(" (failed: {})", e.replace('|', "/"))
        });
        let _ = writeln!(
            md,
            "| {} | {} | {}{} | {} | {} | {} | {} | {} |",
            run.clients,
            if run.sampler { "on" } else { "off" },
            fmt(run.median_step_ms, 1),
            note,
            pct(over),
            fmt(run.median_thread_cpu_ms, 1),
            pct(cpu_over),
            fmt(run.median_publish_us, 1),
            run.step_ms.len()
        );
    }
    md.push('\n');
    md
}

fn queue_table(q: &QueueRun) -> String {
    let c = &q.case;
    let mut md = format!(
        "### Hidden-state queue ({} producers → {} consumers, items [1, {}, {}] f32 = {:.0} MiB, capacity {}, watermarks {}/{}, byte cap {} items)\n\n\
         | items | elapsed ms | items/s | µs per item | GiB/s handed over | producer blocked ms | consumer starved ms |\n|---|---|---|---|---|---|---|\n",
        c.producers, c.consumers, c.seq_len, c.features, q.item_bytes as f64 / (1u64 << 20) as f64, c.capacity, c.high_watermark, c.low_watermark, c.byte_cap_items
    );
    let _ = writeln!(
        md,
        "| {} | {:.1} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} |{}",
        c.items,
        q.elapsed_ms,
        q.items_per_s,
        q.us_per_item,
        q.gib_per_s,
        q.producer_blocked_ms,
        q.consumer_starved_ms,
        q.error
            .as_ref()
            .map_or(String::new(), |e| format!(" error: {e}"))
    );
    md.push('\n');
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machine_probe_reads_this_host() {
        let m = Machine::probe(2);
        assert!(m.nproc >= 1 && m.mem_total_gb > 0.0);
        assert!(!m.cpu_model.is_empty());
    }

    #[test]
    fn an_empty_report_still_has_a_summary_and_says_what_was_not_done() {
        let mut r = BenchReport {
            machine: Machine::probe(1),
            ..BenchReport::default()
        };
        r.not_done.push("queue: not on main".into());
        let s = r.summary();
        assert!(s.get("engine_step_ms").is_none());
        assert!(s["matmul_peak_gflops"].is_null());
        assert!(r.markdown().contains("not done: queue"));
        assert_eq!(fmt(None, 2), "–");
        assert_eq!(fmt(Some(1.234), 1), "1.2");
    }
}
