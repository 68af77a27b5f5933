//! Safetensors checkpoints (single file or sharded with `model.safetensors.index.json`), read by
//! tensor name.
//!
//! Loading goes shard by shard and tensor by tensor: a shard is memory-mapped, each requested
//! tensor is copied out of the map into its own tensor and moved to the target device, then the map
//! is dropped. At most one tensor's bytes sit in host memory at a time (besides the page cache), so
//! several replicas of a 54 GB model can load on one box.
use crate::files::atomic_write::{write_atomic, write_atomic_with};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use tch::{Device, Kind, Tensor};

use super::error::ModelError;

pub const SINGLE_FILE: &str = "model.safetensors";
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One tensor to load: its checkpoint name and the shape the model expects.
#[derive(Debug, Clone)]
pub struct TensorRequest {
    pub name: String,
    pub shape: Vec<i64>,
}

/// Where each tensor of a checkpoint lives.
#[derive(Debug)]
pub struct CheckpointIndex {
    dir: PathBuf,
    /// The file that maps names to shards (the index, or the single file itself).
    listing: PathBuf,
    sharded: bool,
    /// Tensor name → shard file name (relative to `dir`).
    weight_map: BTreeMap<String, String>,
}

impl CheckpointIndex {
    pub fn open(dir: &Path) -> Result<Self, ModelError> {
        let index_path = dir.join(INDEX_FILE);
        if index_path.is_file() {
            return Self::from_index(dir, index_path);
        }
        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            let mmap = map_file(&single)?;
            let (_, metadata) =
                SafeTensors::read_metadata(&mmap).map_err(|e| ModelError::Safetensors {
                    file: single.clone(),
                    reason: e.to_string(),
                })?;
            let weight_map = metadata
                .tensors()
                .into_keys()
                .map(|name| (name, SINGLE_FILE.to_string()))
                .collect();
            return Ok(Self {
                dir: dir.to_path_buf(),
                listing: single,
                sharded: false,
                weight_map,
            });
        }
        Err(ModelError::NoCheckpoint {
            dir: dir.to_path_buf(),
        })
    }

    fn from_index(dir: &Path, index_path: PathBuf) -> Result<Self, ModelError> {
        let text =
            std::fs::read_to_string(&index_path).map_err(|e| ModelError::io(&index_path, e))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|source| ModelError::Json {
                path: index_path.clone(),
                cause: source,
            })?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| ModelError::ConfigValue {
                path: index_path.clone(),
                key: "weight_map".into(),
                expected: "an object of tensor name → shard file".into(),
                found: json
                    .get("weight_map")
                    .map_or("nothing".into(), |v| v.to_string()),
            })?;
        let mut weight_map = BTreeMap::new();
        for (name, shard) in map {
            let shard = shard.as_str().ok_or_else(|| ModelError::ConfigValue {
                path: index_path.clone(),
                key: format!("weight_map.{name}"),
                expected: "a shard file name".into(),
                found: shard.to_string(),
            })?;
            // A shard name is a plain file name inside the checkpoint directory.
            if shard.contains('/') || shard.contains('\\') || shard == ".." {
                return Err(ModelError::ConfigValue {
                    path: index_path.clone(),
                    key: format!("weight_map.{name}"),
                    expected: "a file name inside the checkpoint directory".into(),
                    found: shard.to_string(),
                });
            }
            weight_map.insert(name.clone(), shard.to_string());
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            listing: index_path,
            sharded: true,
            weight_map,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn contains(&self, name: &str) -> bool {
        self.weight_map.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.weight_map.keys().map(String::as_str)
    }

    /// The file an error about a missing name should point at.
    pub fn listing(&self) -> &Path {
        &self.listing
    }

    /// The dtype a tensor is stored in, read from its shard's header.
    pub fn stored_kind(&self, name: &str) -> Result<Kind, ModelError> {
        let path = self.shard_path(name)?;
        let mmap = map_file(&path)?;
        let tensors = parse(&path, &mmap)?;
        let view = tensors
            .tensor(name)
            .map_err(|_| ModelError::MissingTensor {
                file: path.clone(),
                tensor: name.to_string(),
            })?;
        kind_of(view.dtype()).ok_or_else(|| ModelError::BadDtype {
            file: path,
            tensor: name.to_string(),
            found: format!("{:?}", view.dtype()),
        })
    }

    fn shard_path(&self, name: &str) -> Result<PathBuf, ModelError> {
        let shard = self
            .weight_map
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                file: self.listing.clone(),
                tensor: name.to_string(),
            })?;
        let path = self.dir.join(shard);
        if !path.is_file() {
            return Err(ModelError::MissingShard {
                index: self.listing.clone(),
                shard: shard.clone(),
                tensor: name.to_string(),
                path,
            });
        }
        Ok(path)
    }

    /// Loads `requests` onto `device` as `kind`, one shard at a time. Every name and shard is
    /// checked before any byte is read, so a bad checkpoint fails fast and allocates nothing.
    pub fn load(
        &self,
        requests: &[TensorRequest],
        device: Device,
        kind: Kind,
    ) -> Result<HashMap<String, Tensor>, ModelError> {
        let mut by_shard: BTreeMap<PathBuf, Vec<&TensorRequest>> = BTreeMap::new();
        for request in requests {
            by_shard
                .entry(self.shard_path(&request.name)?)
                .or_default()
                .push(request);
        }
        let mut out = HashMap::with_capacity(requests.len());
        for (path, shard_requests) in by_shard {
            let mmap = map_file(&path)?;
            let tensors = parse(&path, &mmap)?;
            for request in shard_requests {
                let tensor = load_one(&path, &tensors, request, device, kind)?;
                out.insert(request.name.clone(), tensor);
            }
        }
        Ok(out)
    }

    pub fn is_sharded(&self) -> bool {
        self.sharded
    }

    /// The files the tensors live in (the single file, or each shard once), sorted.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = self
            .weight_map
            .values()
            .map(|shard| self.dir.join(shard))
            .collect();
        files.sort();
        files.dedup();
        files
    }

    /// Every tensor of every file as its header describes it, by name. Only the headers are
    /// read, so a checkpoint is judged before any of its bytes are copied.
    pub fn stored_tensors(&self) -> Result<BTreeMap<String, StoredTensor>, ModelError> {
        let mut out = BTreeMap::new();
        for file in self.files() {
            if !file.is_file() {
                return Err(ModelError::MissingShard {
                    index: self.listing.clone(),
                    shard: file
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    tensor: self
                        .weight_map
                        .iter()
                        .find(|(_, shard)| self.dir.join(shard) == file)
                        .map(|(name, _)| name.clone())
                        .unwrap_or_default(),
                    path: file,
                });
            }
            let mmap = map_file(&file)?;
            let (_, metadata) =
                SafeTensors::read_metadata(&mmap).map_err(|e| ModelError::Safetensors {
                    file: file.clone(),
                    reason: e.to_string(),
                })?;
            for (name, info) in metadata.tensors() {
                let stored = StoredTensor {
                    file: file.clone(),
                    shape: info.shape.iter().map(|&d| d as i64).collect(),
                    dtype: format!("{:?}", info.dtype),
                    kind: kind_of(info.dtype),
                };
                out.insert(name, stored);
            }
        }
        Ok(out)
    }
}

/// One tensor as its file's header describes it (no data read).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredTensor {
    pub file: PathBuf,
    pub shape: Vec<i64>,
    /// The safetensors dtype as the header names it (`F32`, `BF16`, `I64`, …).
    pub dtype: String,
    /// The dtype as a float [`Kind`]; `None` for any dtype that is not one [`kind_of`] reads.
    pub kind: Option<Kind>,
}

fn map_file(path: &Path) -> Result<Mmap, ModelError> {
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    // SAFETY: the map is read-only and lives only while one shard is being copied out; a
    // checkpoint rewritten underneath a running load is outside what any loader can defend against.
    unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))
}

fn parse<'a>(path: &Path, bytes: &'a [u8]) -> Result<SafeTensors<'a>, ModelError> {
    SafeTensors::deserialize(bytes).map_err(|e| ModelError::Safetensors {
        file: path.to_path_buf(),
        reason: e.to_string(),
    })
}

fn load_one(
    path: &Path,
    tensors: &SafeTensors<'_>,
    request: &TensorRequest,
    device: Device,
    kind: Kind,
) -> Result<Tensor, ModelError> {
    let view = tensors
        .tensor(&request.name)
        .map_err(|_| ModelError::MissingTensor {
            file: path.to_path_buf(),
            tensor: request.name.clone(),
        })?;
    let found: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
    if found != request.shape {
        return Err(ModelError::WrongShape {
            file: path.to_path_buf(),
            tensor: request.name.clone(),
            expected: request.shape.clone(),
            found,
        });
    }
    let stored = kind_of(view.dtype()).ok_or_else(|| ModelError::BadDtype {
        file: path.to_path_buf(),
        tensor: request.name.clone(),
        found: format!("{:?}", view.dtype()),
    })?;
    let host = Tensor::f_from_data_size(view.data(), &found, stored)?;
    // Move first, convert on the device: a bf16 checkpoint converted to f32 never doubles in host RAM.
    let on_device = if device == Device::Cpu {
        host
    } else {
        host.f_to_device(device)?
    };
    Ok(if stored == kind {
        on_device
    } else {
        on_device.f_to_kind(kind)?
    })
}

/// The float dtypes a target checkpoint may hold.
pub fn kind_of(dtype: Dtype) -> Option<Kind> {
    match dtype {
        Dtype::F32 => Some(Kind::Float),
        Dtype::BF16 => Some(Kind::BFloat16),
        Dtype::F16 => Some(Kind::Half),
        _ => None,
    }
}

pub fn dtype_of(kind: Kind) -> Option<Dtype> {
    match kind {
        Kind::Float => Some(Dtype::F32),
        Kind::BFloat16 => Some(Dtype::BF16),
        Kind::Half => Some(Dtype::F16),
        Kind::Int64 => Some(Dtype::I64),
        _ => None,
    }
}

/// A host copy of a tensor in the form `safetensors` serialises. Bytes are produced lazily, so a
/// writer holds one tensor in host memory at a time.
pub struct HostTensor<'a> {
    tensor: &'a Tensor,
    dtype: Dtype,
    shape: Vec<usize>,
}

impl<'a> HostTensor<'a> {
    pub fn new(tensor: &'a Tensor) -> Result<Self, ModelError> {
        let kind = tensor.kind();
        let dtype = dtype_of(kind).ok_or_else(|| ModelError::UnsupportedDtype {
            found: format!("{kind:?}"),
        })?;
        let shape = tensor.size().iter().map(|&d| d as usize).collect();
        Ok(Self {
            tensor,
            dtype,
            shape,
        })
    }
}

impl safetensors::View for HostTensor<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        let host = self.tensor.to_device(Device::Cpu).contiguous();
        let numel = host.numel();
        let mut bytes = vec![0u8; self.data_len()];
        host.copy_data_u8(&mut bytes, numel);
        bytes.into()
    }

    fn data_len(&self) -> usize {
        self.shape.iter().product::<usize>() * self.dtype.bitsize() / 8
    }
}

/// Writes `tensors` as one safetensors file at `path`, atomically: a temporary file in the same
/// directory is renamed over `path` once complete, so a crash never leaves a truncated file.
pub fn write_safetensors_atomic(
    path: &Path,
    tensors: &[(String, &Tensor)],
    metadata: HashMap<String, String>,
) -> Result<(), ModelError> {
    let views = tensors
        .iter()
        .map(|(name, t)| Ok((name.clone(), HostTensor::new(t)?)))
        .collect::<Result<Vec<_>, ModelError>>()?;
    write_atomic_with(
        path,
        |tmp| {
            safetensors::serialize_to_file(views, Some(metadata), tmp).map_err(|e| {
                ModelError::Safetensors {
                    file: tmp.to_path_buf(),
                    reason: e.to_string(),
                }
            })
        },
        |p, e| ModelError::io(p, e),
    )
}

/// Writes `bytes` to `path` atomically.
pub fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> Result<(), ModelError> {
    write_atomic(path, bytes).map_err(|e| ModelError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, tensors: &[(&str, Tensor)]) {
        let named: Vec<(String, &Tensor)> =
            tensors.iter().map(|(n, t)| (n.to_string(), t)).collect();
        write_safetensors_atomic(&dir.join(file), &named, HashMap::new()).unwrap();
    }

    #[test]
    fn single_file_round_trip_with_dtype_conversion() {
        let _rng = crate::device::global_rng::seeded(1);
        let dir = tempfile::tempdir().unwrap();
        let a = Tensor::randn([3, 4], (Kind::Float, Device::Cpu));
        write(dir.path(), SINGLE_FILE, &[("a", a.shallow_clone())]);
        let index = CheckpointIndex::open(dir.path()).unwrap();
        assert!(!index.is_sharded());
        assert_eq!(index.stored_kind("a").unwrap(), Kind::Float);
        let req = [TensorRequest {
            name: "a".into(),
            shape: vec![3, 4],
        }];
        let loaded = index.load(&req, Device::Cpu, Kind::Float).unwrap();
        assert!(loaded["a"].equal(&a));
        let bf = index.load(&req, Device::Cpu, Kind::BFloat16).unwrap();
        assert_eq!(bf["a"].kind(), Kind::BFloat16);
    }

    #[test]
    fn sharded_checkpoint_reports_missing_shard_and_wrong_shape() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "s1.safetensors",
            &[("a", Tensor::zeros([2], (Kind::Float, Device::Cpu)))],
        );
        let index_json = r#"{"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors"}}"#;
        std::fs::write(dir.path().join(INDEX_FILE), index_json).unwrap();
        let index = CheckpointIndex::open(dir.path()).unwrap();
        assert!(index.is_sharded());

        let wrong = [TensorRequest {
            name: "a".into(),
            shape: vec![3],
        }];
        let err = index
            .load(&wrong, Device::Cpu, Kind::Float)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("s1.safetensors")
                && err.contains("`a`")
                && err.contains("[3]")
                && err.contains("[2]"),
            "{err}"
        );

        let missing = [TensorRequest {
            name: "b".into(),
            shape: vec![2],
        }];
        let err = index
            .load(&missing, Device::Cpu, Kind::Float)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("s2.safetensors") && err.contains("missing") && err.contains("`b`"),
            "{err}"
        );

        let absent = [TensorRequest {
            name: "c".into(),
            shape: vec![2],
        }];
        let err = index
            .load(&absent, Device::Cpu, Kind::Float)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(INDEX_FILE) && err.contains("`c` is missing"),
            "{err}"
        );
    }

    #[test]
    fn stored_tensors_read_each_shards_header_and_name_a_missing_shard() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "s1.safetensors",
            &[("a", Tensor::zeros([2, 3], (Kind::BFloat16, Device::Cpu)))],
        );
        write(
            dir.path(),
            "s2.safetensors",
            &[("ids", Tensor::from_slice(&[1i64, 2]))],
        );
        let index_json = r#"{"weight_map": {"a": "s1.safetensors", "ids": "s2.safetensors"}}"#;
        std::fs::write(dir.path().join(INDEX_FILE), index_json).unwrap();
        let index = CheckpointIndex::open(dir.path()).unwrap();
        assert_eq!(
            index.files(),
            [
                dir.path().join("s1.safetensors"),
                dir.path().join("s2.safetensors")
            ]
        );
        let stored = index.stored_tensors().unwrap();
        assert_eq!(stored["a"].shape, [2, 3]);
        assert_eq!(stored["a"].kind, Some(Kind::BFloat16));
        assert_eq!(
            (stored["ids"].kind, stored["ids"].dtype.as_str()),
            (None, "I64")
        );

        std::fs::remove_file(dir.path().join("s2.safetensors")).unwrap();
        let err = index.stored_tensors().unwrap_err().to_string();
        assert!(
            err.contains("s2.safetensors") && err.contains("`ids`") && err.contains("missing"),
            "{err}"
        );
    }

    #[test]
    fn shard_names_may_not_leave_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(INDEX_FILE),
            r#"{"weight_map": {"a": "../x.safetensors"}}"#,
        )
        .unwrap();
        let err = CheckpointIndex::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("weight_map.a"), "{err}");
    }

    #[test]
    fn non_float_tensors_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            SINGLE_FILE,
            &[("ids", Tensor::from_slice(&[1i64, 2]))],
        );
        let index = CheckpointIndex::open(dir.path()).unwrap();
        let req = [TensorRequest {
            name: "ids".into(),
            shape: vec![2],
        }];
        let err = index
            .load(&req, Device::Cpu, Kind::Float)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`ids`") && err.contains("I64"), "{err}");
    }

    #[test]
    fn garbage_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(SINGLE_FILE), b"not a safetensors file").unwrap();
        let err = CheckpointIndex::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains(SINGLE_FILE) && err.contains("not a valid safetensors"),
            "{err}"
        );
    }
}
