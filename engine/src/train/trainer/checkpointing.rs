//! A trainer's checkpoints: writing one of the current step, and restoring one after the
//! checks of [`crate::train::resume`] (checksums, drafter, locked keys, data).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use tch::Tensor;

use super::Trainer;
use crate::train::checkpoint::{self, CheckpointWriter};
use crate::train::error::TrainError;
use crate::train::replica::ReplicaState;
use crate::train::resume::{
    config_verdict, SavedConfigs, TrainerState, CONFIG_FILE, DRAFTER_FILE, OPTIMIZER_FILE,
    STATE_FILE,
};
use crate::train::unlocked::{self, UnlockedKeys};

impl Trainer {
    /// Writes a checkpoint of the current step under `root` and prunes old ones.
    pub fn save_checkpoint(&self, root: &Path) -> Result<PathBuf, TrainError> {
        let state = TrainerState {
            step: self.step,
            optimizer_step: self.rank0.replica.optimizer().step_count(),
            position: self.data_position(),
            micro_batches_per_step: Some(self.assignment().micro_per_step()),
            rng: None,
            schedule: self.schedule().clone(),
            config: self.config().clone(),
            data_digest: self.data_digest().to_string(),
            dtype: format!(
                "{:?}",
                crate::device::compute_kind(self.rank0.replica.device())
            ),
            best: self.best,
        };
        let mut w = CheckpointWriter::begin(root, self.step)?;
        let optimizer = self.rank0.replica.optimizer();
        w.write_tensors(DRAFTER_FILE, &optimizer.master_weights())?;
        w.write_tensors(OPTIMIZER_FILE, &optimizer.moment_tensors())?;
        w.write_json(CONFIG_FILE, &self.drafter_config().to_hf_json())?;
        w.write_json(STATE_FILE, &state)?;
        let dir = w.commit()?;
        checkpoint::prune(
            root,
            self.config().training.keep_checkpoints,
            self.best.map(|b| b.step),
        )?;
        Ok(dir)
    }

    /// Restores weights, optimizer, schedule, RNG and data position from `dir` after checking
    /// its checksums, and that the drafter, the locked training keys and the data are the ones
    /// this trainer was built with.
    pub fn restore_checkpoint(&mut self, dir: &Path) -> Result<(), TrainError> {
        self.restore_checkpoint_unlocked(dir, &UnlockedKeys::default())
    }

    /// [`Trainer::restore_checkpoint`], letting the `unlocked` locked keys differ from the
    /// checkpoint where its weights, optimizer state and data position still carry over.
    pub fn restore_checkpoint_unlocked(
        &mut self,
        dir: &Path,
        unlocked: &UnlockedKeys,
    ) -> Result<(), TrainError> {
        checkpoint::verify(dir)?;
        let incompatible = |detail: String| TrainError::Incompatible {
            checkpoint: dir.to_path_buf(),
            detail,
        };
        let state: TrainerState = checkpoint::read_json(dir, STATE_FILE)?;
        let saved_drafter: Value = checkpoint::read_json(dir, CONFIG_FILE)?;
        let saved = SavedConfigs {
            train: &state.config,
            drafter_hf: &saved_drafter,
        };
        let now_drafter = self.drafter_config().to_hf_json();
        let now = SavedConfigs {
            train: self.config(),
            drafter_hf: &now_drafter,
        };
        config_verdict(&saved, &now, unlocked).map_err(incompatible)?;
        if state.data_digest != self.data_digest() {
            return Err(incompatible(format!(
                "the training data changed (digest {} in the checkpoint, {} now); its data position would be meaningless",
                state.data_digest,
                self.data_digest()
            )));
        }
        let per_step = state
            .micro_batches_per_step
            .unwrap_or(state.config.training.grad_accum as u64);
        if per_step != self.assignment().micro_per_step() {
            return Err(incompatible(format!(
                "the global batch differs: the checkpoint trained {per_step} micro-batches per step, \
                 this topology trains {} ({} drafter rank(s) × grad_accum {})",
                self.assignment().micro_per_step(),
                self.assignment().ranks,
                self.assignment().accum
            )));
        }
        // With epochs unlocked the trainer's schedule (built from the new total) replaces the
        // checkpoint's; the data position below is kept either way.
        unlocked::check_schedule(&state.schedule, self.schedule(), state.step, unlocked)
            .map_err(incompatible)?;
        let cursor = self
            .source()
            .consumed_at(state.position)
            .map_err(incompatible)?;
        let master = tensor_map(checkpoint::read_tensors(dir, DRAFTER_FILE)?);
        let moments = tensor_map(checkpoint::read_tensors(dir, OPTIMIZER_FILE)?);
        self.rank0
            .replica
            .load_state(&ReplicaState {
                master,
                moments,
                optimizer_step: state.optimizer_step,
            })
            .map_err(|e| incompatible(e.to_string()))?;
        self.step = state.step;
        self.cursor = cursor;
        // A best rotated away is forgotten rather than named: only a resume from an older
        // checkpoint (`--resume-from`) can find its best gone, after a later best released it.
        self.best = state
            .best
            .filter(|b| dir.parent().is_some_and(|root| b.is_on_disk(root)));
        if let Some(cluster) = self.cluster.as_mut() {
            cluster.sync_replicas(&self.rank0)?;
            cluster.restart_at(cursor);
        }
        Ok(())
    }

    /// Resumes from the newest checkpoint under `root`, if any. Returns its directory.
    pub fn resume_latest(&mut self, root: &Path) -> Result<Option<PathBuf>, TrainError> {
        self.resume_latest_unlocked(root, &UnlockedKeys::default())
    }

    /// [`Trainer::resume_latest`] with the operator's unlocked keys (see
    /// [`Trainer::restore_checkpoint_unlocked`]).
    pub fn resume_latest_unlocked(
        &mut self,
        root: &Path,
        unlocked: &UnlockedKeys,
    ) -> Result<Option<PathBuf>, TrainError> {
        checkpoint::recover(root)?;
        match checkpoint::latest(root)? {
            Some(dir) => {
                self.restore_checkpoint_unlocked(&dir, unlocked)?;
                Ok(Some(dir))
            }
            None => Ok(None),
        }
    }
}

fn tensor_map(list: Vec<(String, Tensor)>) -> HashMap<String, Tensor> {
    list.into_iter().collect()
}
