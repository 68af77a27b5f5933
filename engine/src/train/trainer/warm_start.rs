//! Starting a fresh run from a drafter's weights (`init_from`), after the checks of
//! [`crate::train::warm_start`].

use std::collections::HashMap;

use tch::{Device, Kind, Tensor};

use super::Trainer;
use crate::files::hash::sha256_file;
use crate::model::weights::TensorRequest;
use crate::train::error::TrainError;
use crate::train::warm_start::{head_name, refused, DrafterSource, WarmStart, WeightFileDigest};

impl Trainer {
    /// Initialises the drafter's trainable weights from `source` (a warm start): rank 0's
    /// fp32 masters take the file's values exactly (converted to fp32; bit-exact from an f32
    /// file), but for the DSpark heads of a DSpark run over a DFlash drafter, which keep rank
    /// 0's own draw ([`DrafterSource::leaves_fresh`]); every other rank copies rank 0, the
    /// optimizer's moments stay zero. Only before
    /// the first step. Every check runs first (config, tensor headers, finite values) and
    /// reports every problem it found; on `Err` the trainer is as it was.
    ///
    /// The weights pass through host memory once, in fp32.
    pub fn init_drafter_from(&mut self, source: &DrafterSource) -> Result<WarmStart, TrainError> {
        if self.step != 0 || self.rank0.replica.optimizer().step_count() != 0 {
            return Err(refused(
                source.dir(),
                vec![format!(
                    "the run is at step {}: a drafter initialises a fresh run, before its first \
                     step (a resumed run continues from its checkpoint)",
                    self.step
                )],
            ));
        }
        source.check_config(self.drafter_config())?;
        // The parameters the directory has none of by design (a DSpark run's heads over a
        // DFlash drafter) keep rank 0's own initialisation: they go to `initialise_weights`
        // as they are, so every rank still starts from rank 0's weights.
        let (fresh, loaded): (Vec<_>, Vec<_>) = self
            .rank0
            .replica
            .optimizer()
            .master_weights()
            .into_iter()
            .partition(|(name, _)| source.leaves_fresh(self.drafter_config(), name));
        let params: Vec<(String, Vec<i64>)> = loaded
            .iter()
            .map(|(name, t)| (name.clone(), t.size()))
            .collect();
        let (problems, not_loaded) = source.tensor_problems(&params);
        if !problems.is_empty() {
            return Err(refused(source.dir(), problems));
        }
        let mut files = Vec::new();
        for file in source.index.files() {
            let digest = sha256_file(&file).map_err(TrainError::io(&file))?;
            files.push(WeightFileDigest {
                file,
                bytes: digest.bytes,
                sha256: digest.sha256,
            });
        }
        let requests: Vec<TensorRequest> = params
            .iter()
            .map(|(name, shape)| TensorRequest {
                name: name.clone(),
                shape: shape.clone(),
            })
            .collect();
        let mut weights: HashMap<String, Tensor> = source
            .index
            .load(&requests, Device::Cpu, Kind::Float)
            .map_err(|e| refused(source.dir(), vec![e.to_string()]))?;
        let mut non_finite: Vec<String> = weights
            .iter()
            .filter(|(_, t)| t.isfinite().all().int64_value(&[]) == 0)
            .map(|(name, _)| {
                format!("tensor `{name}` holds NaN or infinite values: a drafter to start from must be finite")
            })
            .collect();
        if !non_finite.is_empty() {
            non_finite.sort();
            return Err(refused(source.dir(), non_finite));
        }
        let fresh_names: Vec<String> = fresh.iter().map(|(name, _)| name.clone()).collect();
        weights.extend(fresh.into_iter().map(|(name, t)| (name, t.copy())));
        self.rank0
            .replica
            .initialise_weights(&weights)
            .map_err(|e| refused(source.dir(), vec![e.to_string()]))?;
        if let Some(cluster) = self.cluster.as_mut() {
            cluster.sync_replicas(&self.rank0)?;
        }
        Ok(WarmStart {
            dir: source.dir().to_path_buf(),
            head: head_name(&self.drafter_config().head),
            files,
            tensors: params.len(),
            fresh: fresh_names,
            not_loaded,
        })
    }
}
