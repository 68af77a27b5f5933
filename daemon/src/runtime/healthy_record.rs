//! The healthy record's I/O: which record a run is judged against at start, and when the
//! record of this run is written (`dflash_shared::health::healthy_record` and
//! `healthy_stretch` are the pure parts).
//!
//! A run is judged against, in order: its own run dir's `healthy.json` (a resumed run), else
//! the last healthy record of the same recipe in `<state_dir>/healthy/` when
//! `detectors.healthy.use_recipe_record` is on (a new run dir of a known recipe). Once the run
//! has been healthy for `detectors.healthy.after_ok_s` (throughput judged Ok past learning, no
//! alert active; a drop being timed holds the stretch without lending it samples), both files
//! are written atomically, and rewritten every `refresh_s` while it stays healthy. Any alert
//! ends the healthy stretch, so a record never holds a sick run.
use std::path::{Path, PathBuf};

use chrono::FixedOffset;
use dflash_engine::files::atomic_write::write_atomic;
use dflash_shared::config::recipe::recipe_text;
use dflash_shared::health::fingerprint::Fingerprint;
use dflash_shared::health::healthy_record::{
    expected_throughput, HealthyRecord, HealthyRecordConfig, RecordScope, ThroughputBasis,
    ThroughputReference, FORMAT,
};
use dflash_shared::health::healthy_stretch::{HealthyStretch, Standing};
use dflash_shared::metrics::{CacheState, GpuSample, QueueStats, StepMetrics, TimestampMs};
use dflash_shared::run_dir::{HEALTHY_RECORD_FILE_NAME, RECIPE_RECORDS_DIR_NAME};
use sha2::{Digest, Sha256};

/// What a record says about the run it was taken from, fixed at start.
#[derive(Debug, Clone)]
pub struct RecordIdentity {
    pub run_name: String,
    pub run_dir: PathBuf,
    /// [`recipe_digest`] of the config, topology and device models.
    pub recipe: String,
    /// "cpu", "targets cuda:0–4, drafters cuda:5–7".
    pub topology: String,
    pub device_models: Vec<String>,
    pub basis: Option<ThroughputBasis>,
}

/// The recipe: the config without the keys that may change between runs of it, the topology
/// and the device models, as a short digest (the file name of its record in the state dir).
pub fn recipe_digest(
    config: &serde_json::Value,
    topology: &str,
    device_models: &[String],
) -> String {
    let mut h = Sha256::new();
    h.update(recipe_text(config).as_bytes());
    h.update(b"\ntopology ");
    h.update(topology.as_bytes());
    h.update(b"\ndevices ");
    h.update(device_models.join(", ").as_bytes());
    hex::encode(h.finalize())[..16].to_string()
}

pub fn run_record_path(run_dir: &Path) -> PathBuf {
    run_dir.join(HEALTHY_RECORD_FILE_NAME)
}

pub fn recipe_record_path(state_dir: &Path, recipe: &str) -> PathBuf {
    state_dir
        .join(RECIPE_RECORDS_DIR_NAME)
        .join(format!("{recipe}.json"))
}

fn read_record(path: &Path) -> Option<HealthyRecord> {
    let text = std::fs::read_to_string(path).ok()?;
    let record = HealthyRecord::parse(&text);
    if record.is_none() {
        tracing::warn!(path = %path.display(), "ignoring a healthy record this build cannot read");
    }
    record
}

/// The record a run is judged against, and whose it is.
pub fn record_to_judge_against(
    cfg: &HealthyRecordConfig,
    identity: &RecordIdentity,
    state_dir: &Path,
    hostname: Option<&str>,
) -> Option<(HealthyRecord, RecordScope)> {
    if let Some(own) = read_record(&run_record_path(&identity.run_dir)) {
        return Some((own, RecordScope::ThisRun));
    }
    if !cfg.use_recipe_record {
        return None;
    }
    let other = read_record(&recipe_record_path(state_dir, &identity.recipe))?;
    let same_machine = match (other.fingerprint.hostname.as_deref(), hostname) {
        (Some(then), Some(now)) => then == now,
        _ => true,
    };
    (other.recipe == identity.recipe && same_machine).then_some((other, RecordScope::Recipe))
}

/// "2026-12-03 21:03" in the machine's offset.
pub fn record_date(ts_ms: TimestampMs, offset: FixedOffset) -> String {
    use chrono::TimeZone;
    match offset.timestamp_millis_opt(ts_ms).single() {
        Some(t) => t.format("%Y-%m-%d %H:%M").to_string(),
        None => "an unknown date".into(),
    }
}

/// Keeps this run's healthy stretch ([`HealthyStretch`]) and writes its record when due.
#[derive(Debug, Clone)]
pub struct HealthyRecordKeeper {
    identity: RecordIdentity,
    state_dir: PathBuf,
    stretch: HealthyStretch,
    /// The record this run is judged against (loaded at start).
    judged_against: Option<(HealthyRecord, RecordScope)>,
}

impl HealthyRecordKeeper {
    pub fn open(
        cfg: HealthyRecordConfig,
        identity: RecordIdentity,
        state_dir: PathBuf,
        hostname: Option<&str>,
    ) -> Self {
        let judged_against = record_to_judge_against(&cfg, &identity, &state_dir, hostname);
        HealthyRecordKeeper {
            stretch: HealthyStretch::new(cfg),
            identity,
            state_dir,
            judged_against,
        }
    }

    /// The files this run's record goes to (and a record it is judged against came from):
    /// the run dir's and the recipe's in the state dir.
    pub fn files(&self) -> Vec<PathBuf> {
        vec![
            run_record_path(&self.identity.run_dir),
            recipe_record_path(&self.state_dir, &self.identity.recipe),
        ]
    }

    /// A confirmed forget: the record files are removed, then there is no record to judge
    /// against and the healthy stretch starts over. Returns the files it removed; when a file
    /// cannot be removed, the error names it and the record is still judged against.
    pub fn forget(&mut self) -> std::io::Result<Vec<PathBuf>> {
        let removed = forget(
            &self.identity.run_dir,
            &self.state_dir,
            Some(&self.identity.recipe),
        )?;
        self.judged_against = None;
        self.stretch.reset();
        Ok(removed)
    }

    pub fn judged_against(&self) -> Option<&HealthyRecord> {
        self.judged_against.as_ref().map(|(r, _)| r)
    }

    /// What the throughput detector expects from the record, adjusted for this data.
    pub fn reference(&self, offset: FixedOffset) -> Option<ThroughputReference> {
        let (record, scope) = self.judged_against.as_ref()?;
        expected_throughput(
            record,
            *scope,
            self.identity.basis.as_ref(),
            &record_date(record.recorded_ms, offset),
        )
    }

    /// How the run stands at `now_ms`: a healthy moment starts or continues the stretch, a
    /// timed drop holds it without lending it samples, a sick one ends it.
    pub fn observe_standing(&mut self, now_ms: TimestampMs, standing: Standing) {
        self.stretch.observe(now_ms, standing);
    }

    /// The stretch's clock, for the status.
    pub fn stretch(&self) -> &HealthyStretch {
        &self.stretch
    }

    pub fn observe_step(&mut self, m: &StepMetrics) {
        self.stretch.observe_step(m);
    }

    pub fn observe_gpu(&mut self, g: &GpuSample) {
        self.stretch.observe_gpu(g);
    }

    pub fn observe_queue(&mut self, q: &QueueStats) {
        self.stretch.observe_queue(q);
    }

    /// Whether a record is due ([`HealthyStretch::due`]).
    pub fn due(&self, now_ms: TimestampMs) -> bool {
        self.stretch.due(now_ms)
    }

    /// Writes the run dir's record and the recipe's; returns the record and whether it was the
    /// first this process wrote.
    ///
    /// `Ok(None)`: declined, because the run is judged against a record whose expected rate is
    /// above this stretch's median. A run Ok but slower than its record (above `warn_below`)
    /// would otherwise become the new reference, and successive restarts each a little slower
    /// could ratchet the record down. A slower rate becomes the record only after a confirmed
    /// forget.
    pub fn write(
        &mut self,
        now_ms: TimestampMs,
        step: u64,
        fingerprint: &Fingerprint,
        caches: &[CacheState],
    ) -> std::io::Result<Option<(HealthyRecord, bool)>> {
        let figures = self
            .stretch
            .window()
            .figures(self.identity.basis.clone())
            .ok_or_else(|| std::io::Error::other("no healthy step to record"))?;
        self.stretch.attempted(now_ms);
        let expected = self
            .reference(FixedOffset::east_opt(0).expect("UTC"))
            .map(|r| r.tokens_per_s);
        if expected.is_some_and(|e| figures.throughput.tokens_per_s < e) {
            return Ok(None);
        }
        let id = &self.identity;
        let record = HealthyRecord {
            format: FORMAT,
            recorded_ms: now_ms,
            healthy_since_ms: self.stretch.window().since_ms().unwrap_or(now_ms),
            run_name: id.run_name.clone(),
            run_dir: id.run_dir.display().to_string(),
            recipe: id.recipe.clone(),
            step,
            throughput: figures.throughput,
            memory: figures.memory,
            queue: figures.queue,
            step_times: figures.step_times,
            fingerprint: fingerprint.clone(),
            caches: caches.to_vec(),
            config_digest: fingerprint.config_hash.clone(),
            data_digest: fingerprint.data_hash.clone(),
            mean_row_tokens: id.basis.as_ref().map(|b| b.mean_row_tokens),
            commit: fingerprint.code_git_commit.clone(),
            topology: id.topology.clone(),
            device_models: id.device_models.clone(),
        };
        let bytes = serde_json::to_vec_pretty(&record).map_err(std::io::Error::other)?;
        write_atomic(&run_record_path(&id.run_dir), &bytes)?;
        let recipe_path = recipe_record_path(&self.state_dir, &id.recipe);
        if let Some(dir) = recipe_path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        write_atomic(&recipe_path, &bytes)?;
        let first = self.stretch.written(now_ms);
        Ok(Some((record, first)))
    }
}

/// Removes the run dir's record and the recipe's (a confirmed "forget"); returns what was
/// removed.
pub fn forget(
    run_dir: &Path,
    state_dir: &Path,
    recipe: Option<&str>,
) -> std::io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let mut paths = vec![run_record_path(run_dir)];
    if let Some(r) = recipe {
        paths.push(recipe_record_path(state_dir, r));
    }
    for p in paths {
        match std::fs::remove_file(&p) {
            Ok(()) => removed.push(p),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("deleting {}: {e}", p.display()),
                ))
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_shared::metrics::StepTimes;

    fn identity(run_dir: &Path) -> RecordIdentity {
        RecordIdentity {
            run_name: "tiny".into(),
            run_dir: run_dir.to_path_buf(),
            recipe: "abc".into(),
            topology: "cpu".into(),
            device_models: Vec::new(),
            basis: None,
        }
    }

    fn step(ts_ms: i64, tokens_per_s: f64) -> StepMetrics {
        StepMetrics {
            ts_ms,
            step: 1,
            epoch: 1,
            loss: 1.0,
            accuracy: 0.5,
            tau: None,
            tau_tree: None,
            lr: 1e-4,
            grad_norm: 1.0,
            tokens_per_s,
            draft_positions_per_s: tokens_per_s,
            mfu: None,
            workers: Vec::new(),
            times: StepTimes::default(),
            online: None,
            domino: None,
            dspark: None,
            dflash2: None,
            job: None,
        }
    }

    /// The one remover: a forget deletes the run dir's record and the recipe's and says which;
    /// one it cannot delete is named, and the record is still judged against.
    #[test]
    fn a_forget_removes_both_records_and_a_failed_one_keeps_judging() {
        let run = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let cfg = HealthyRecordConfig {
            after_ok_s: 2.0,
            refresh_s: 1.0,
            use_recipe_record: true,
        };
        let open = || {
            HealthyRecordKeeper::open(
                cfg.clone(),
                identity(run.path()),
                state.path().to_path_buf(),
                None,
            )
        };
        let mut writer = open();
        for s in 0..4 {
            writer.observe_standing(s * 1000, Standing::Healthy);
            writer.observe_step(&step(s * 1000, 1_000.0));
        }
        writer
            .write(3_000, 4, &Fingerprint::default(), &[])
            .unwrap()
            .unwrap();
        let mut keeper = open();
        assert!(keeper.judged_against().is_some());
        let [run_record, recipe_record] = [0, 1].map(|i| keeper.files()[i].clone());
        std::fs::remove_file(&run_record).unwrap();
        std::fs::create_dir(&run_record).unwrap();
        let err = keeper.forget().unwrap_err();
        assert!(
            err.to_string().contains(&run_record.display().to_string()),
            "{err}"
        );
        assert!(
            keeper.judged_against().is_some(),
            "a failed forget keeps it"
        );
        assert!(recipe_record.is_file());
        std::fs::remove_dir(&run_record).unwrap();
        std::fs::write(&run_record, "{}").unwrap();
        assert_eq!(keeper.forget().unwrap(), vec![run_record, recipe_record]);
        assert!(keeper.judged_against().is_none());
        assert!(keeper.files().iter().all(|f| !f.exists()));
    }

    #[test]
    fn a_record_is_written_after_a_healthy_stretch_and_judges_the_next_start() {
        let run = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let cfg = HealthyRecordConfig {
            after_ok_s: 10.0,
            refresh_s: 5.0,
            use_recipe_record: true,
        };
        let mut k = HealthyRecordKeeper::open(
            cfg.clone(),
            identity(run.path()),
            state.path().to_path_buf(),
            None,
        );
        assert!(k.judged_against().is_none());
        for s in 0..8 {
            k.observe_standing(s * 1000, Standing::Healthy);
            k.observe_step(&step(s * 1000, 1_600.0));
        }
        assert!(!k.due(8_000), "healthy for 8 s of 10");
        // An alert ends the stretch and its samples.
        k.observe_standing(8_000, Standing::Sick);
        for s in 9..21 {
            k.observe_standing(s * 1000, Standing::Healthy);
            k.observe_step(&step(s * 1000, 1_500.0));
        }
        assert!(!k.due(18_000));
        assert!(k.due(19_000));
        let (record, first) = k
            .write(19_000, 40, &Fingerprint::default(), &[])
            .unwrap()
            .unwrap();
        assert!(first);
        assert_eq!(record.throughput.tokens_per_s, 1_500.0);
        assert!(!k.due(20_000), "refreshed every 5 s");
        assert!(k.due(24_000));

        // A restart in the same run dir is judged against it.
        let again = HealthyRecordKeeper::open(
            cfg.clone(),
            identity(run.path()),
            state.path().to_path_buf(),
            None,
        );
        let r = again.reference(FixedOffset::east_opt(0).unwrap()).unwrap();
        assert_eq!((r.tokens_per_s, r.scope), (1_500.0, RecordScope::ThisRun));
        // No ratchet: a restart Ok at 1.4K against the 1.5K record leaves the record alone; one
        // at 1.6K refreshes it.
        let mut again = again;
        for s in 100..112 {
            again.observe_standing(s * 1000, Standing::Healthy);
            again.observe_step(&step(s * 1000, 1_400.0));
        }
        assert!(again.due(111_000));
        assert!(again
            .write(111_000, 50, &Fingerprint::default(), &[])
            .unwrap()
            .is_none());
        assert!(
            !again.due(112_000),
            "declined, and the refresh clock restarts"
        );
        let on_file = std::fs::read_to_string(run_record_path(run.path())).unwrap();
        assert!(on_file.contains("1500"), "{on_file}");
        again.observe_standing(112_000, Standing::Sick);
        for s in 120..132 {
            again.observe_standing(s * 1000, Standing::Healthy);
            again.observe_step(&step(s * 1000, 1_600.0));
        }
        let (faster, _) = again
            .write(131_000, 60, &Fingerprint::default(), &[])
            .unwrap()
            .unwrap();
        assert_eq!(faster.throughput.tokens_per_s, 1_600.0);
        // A new run dir of the same recipe, by the recipe's record.
        let other = tempfile::tempdir().unwrap();
        let fresh = HealthyRecordKeeper::open(
            cfg.clone(),
            identity(other.path()),
            state.path().to_path_buf(),
            None,
        );
        let r = fresh.reference(FixedOffset::east_opt(0).unwrap()).unwrap();
        assert_eq!(r.scope, RecordScope::Recipe);
        assert!(
            r.source
                .starts_with("this recipe ran at 1.6K tok/s here on 1970-01-01 00:02"),
            "{}",
            r.source
        );
        // Not with the recipe record switched off, nor for another recipe.
        let off = HealthyRecordConfig {
            use_recipe_record: false,
            ..cfg.clone()
        };
        assert!(
            HealthyRecordKeeper::open(off, identity(other.path()), state.path().into(), None)
                .judged_against()
                .is_none()
        );
        let mut another = identity(other.path());
        another.recipe = "def".into();
        assert!(
            HealthyRecordKeeper::open(cfg, another, state.path().into(), None)
                .judged_against()
                .is_none()
        );
        // Forgetting removes both.
        let removed = forget(run.path(), state.path(), Some("abc")).unwrap();
        assert_eq!(removed.len(), 2);
        assert!(forget(run.path(), state.path(), Some("abc"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn the_recipe_digest_changes_with_the_topology_and_not_with_the_run_name() {
        let a = serde_json::json!({"run": {"name": "a"}, "training": {"batch_size": 4}});
        let b = serde_json::json!({"run": {"name": "b"}, "training": {"batch_size": 4}});
        assert_eq!(recipe_digest(&a, "cpu", &[]), recipe_digest(&b, "cpu", &[]));
        assert_ne!(
            recipe_digest(&a, "cpu", &[]),
            recipe_digest(&a, "cuda:0", &[])
        );
        assert_eq!(recipe_digest(&a, "cpu", &[]).len(), 16);
    }
}
