//! Which NVML device each CUDA device index is. Pure: the caller reads the NVML table and the
//! environment.
//!
//! CUDA numbers devices by `CUDA_DEVICE_ORDER`: `FASTEST_FIRST` (its default: the fastest
//! device first, ties in PCI bus order) or `PCI_BUS_ID`; then `CUDA_VISIBLE_DEVICES` picks and
//! reorders them (integer indices into that order, `GPU-` UUID prefixes, `MIG-` instance UUIDs;
//! CUDA ignores everything from the first invalid entry on). NVML always enumerates in PCI bus
//! order. So CUDA index i is NVML index i only on some boxes: the mapping goes by PCI bus id
//! and UUID, never by position.
//!
//! What cannot be known from NVML is refused rather than guessed: under `FASTEST_FIRST` on a
//! box with different GPU models, CUDA's speed ranking is its own, so integer entries map to
//! [`Mapped::Unresolved`] with what to set. A MIG instance has no NVML device index of its own
//! and is reported as [`Mapped::Mig`].

/// One GPU as NVML lists it (NVML index = position in the table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmlGpu {
    pub uuid: String,
    /// `domain:bus:device.function`, any case and zero padding.
    pub pci_bus_id: String,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CudaOrder {
    FastestFirst,
    PciBusId,
}

impl CudaOrder {
    /// `CUDA_DEVICE_ORDER` as CUDA reads it: anything but `PCI_BUS_ID` is the default.
    pub fn from_env(value: Option<&str>) -> Self {
        match value.map(str::trim) {
            Some("PCI_BUS_ID") => CudaOrder::PciBusId,
            _ => CudaOrder::FastestFirst,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mapped {
    /// This NVML index.
    Nvml(u32),
    /// A MIG instance (its UUID): no NVML device index.
    Mig(String),
    /// Not knowable from NVML; the text says why and what to set.
    Unresolved(String),
}

/// One CUDA device of this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaGpu {
    pub cuda_index: usize,
    /// How `CUDA_VISIBLE_DEVICES` named it (`3`, `GPU-8a1…`, `MIG-…`), or its position when unset.
    pub entry: String,
    pub mapped: Mapped,
}

impl CudaGpu {
    pub fn nvml_index(&self) -> Option<u32> {
        match self.mapped {
            Mapped::Nvml(i) => Some(i),
            _ => None,
        }
    }

    /// `cuda:1 = nvml 3 (GPU-…)`, `cuda:0 = MIG-… (a MIG instance: no NVML device index)`.
    pub fn describe(&self, table: &[NvmlGpu]) -> String {
        match &self.mapped {
            Mapped::Nvml(i) => {
                let gpu = &table[*i as usize];
                format!(
                    "cuda:{} = nvml {i} ({}, {}, PCI {})",
                    self.cuda_index, gpu.name, gpu.uuid, gpu.pci_bus_id
                )
            }
            Mapped::Mig(uuid) => format!(
                "cuda:{} = {uuid} (a MIG instance: no NVML device index of its own)",
                self.cuda_index
            ),
            Mapped::Unresolved(why) => format!("cuda:{} = unknown ({why})", self.cuda_index),
        }
    }
}

/// `0000:3b:00.0` and `00000000:3B:00.0` are the same device.
fn normalize_bus_id(id: &str) -> (u64, u64, u64, u64) {
    let (domain, rest) = id.trim().rsplit_once(':').map_or(("", id), |(d, r)| (d, r));
    let (domain, bus) = domain.rsplit_once(':').unwrap_or(("0", domain));
    let (device, function) = rest.split_once('.').unwrap_or((rest, "0"));
    let hex = |s: &str| u64::from_str_radix(s, 16).unwrap_or(u64::MAX);
    (hex(domain), hex(bus), hex(device), hex(function))
}

/// CUDA's enumeration of all GPUs before `CUDA_VISIBLE_DEVICES`: NVML indices in CUDA order,
/// or why that order is not knowable.
fn enumeration(order: CudaOrder, table: &[NvmlGpu]) -> Result<Vec<u32>, String> {
    let mut by_bus: Vec<u32> = (0..table.len() as u32).collect();
    by_bus.sort_by_key(|&i| normalize_bus_id(&table[i as usize].pci_bus_id));
    let uniform = table.windows(2).all(|w| w[0].name == w[1].name);
    match order {
        CudaOrder::PciBusId => Ok(by_bus),
        // Equal devices rank equal, and CUDA keeps them in PCI bus order.
        CudaOrder::FastestFirst if uniform => Ok(by_bus),
        CudaOrder::FastestFirst => Err(
            "CUDA_DEVICE_ORDER is FASTEST_FIRST (the default) on a box with different GPU models, \
             whose speed ranking NVML cannot tell; set CUDA_DEVICE_ORDER=PCI_BUS_ID (or name GPUs \
             by UUID in CUDA_VISIBLE_DEVICES)"
                .into(),
        ),
    }
}

/// The CUDA devices this process sees and the NVML device each one is.
pub fn map_cuda_devices(
    order: CudaOrder,
    visible: Option<&str>,
    table: &[NvmlGpu],
) -> Vec<CudaGpu> {
    let enumerated = enumeration(order, table);
    let by_position = |pos: usize| -> Mapped {
        match &enumerated {
            Ok(list) => Mapped::Nvml(list[pos]),
            Err(why) => Mapped::Unresolved(why.clone()),
        }
    };
    let Some(visible) = visible else {
        return (0..table.len())
            .map(|i| CudaGpu {
                cuda_index: i,
                entry: i.to_string(),
                mapped: by_position(i),
            })
            .collect();
    };
    let mut out: Vec<CudaGpu> = Vec::new();
    for entry in visible.split(',').map(str::trim) {
        let mapped = if let Ok(pos) = entry.parse::<usize>() {
            if pos >= table.len() {
                break;
            }
            by_position(pos)
        } else if entry.starts_with("GPU-") {
            let hits: Vec<usize> = (0..table.len())
                .filter(|&i| table[i].uuid.starts_with(entry))
                .collect();
            match hits.as_slice() {
                [one] => Mapped::Nvml(*one as u32),
                // No match or an ambiguous prefix: CUDA stops here.
                _ => break,
            }
        } else if entry.starts_with("MIG-") {
            Mapped::Mig(entry.to_string())
        } else {
            break;
        };
        // A device named twice is invalid to CUDA as well.
        if out
            .iter()
            .any(|g| g.mapped == mapped && !matches!(mapped, Mapped::Unresolved(_)))
        {
            break;
        }
        out.push(CudaGpu {
            cuda_index: out.len(),
            entry: entry.to_string(),
            mapped,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(uuid: &str, bus: &str, name: &str) -> NvmlGpu {
        NvmlGpu {
            uuid: uuid.into(),
            pci_bus_id: bus.into(),
            name: name.into(),
        }
    }

    fn nvml(mapped: &[CudaGpu]) -> Vec<Option<u32>> {
        mapped.iter().map(CudaGpu::nvml_index).collect()
    }

    /// Four H200s as NVML lists them (PCI bus order), one bus id written differently.
    fn uniform() -> Vec<NvmlGpu> {
        vec![
            gpu("GPU-aaaa-1", "00000000:18:00.0", "NVIDIA H200"),
            gpu("GPU-bbbb-2", "0000:3a:00.0", "NVIDIA H200"),
            gpu("GPU-cccc-3", "00000000:9A:00.0", "NVIDIA H200"),
            gpu("GPU-dddd-4", "00000000:BA:00.0", "NVIDIA H200"),
        ]
    }

    #[test]
    fn a_uniform_box_maps_in_pci_bus_order_under_either_order() {
        for order in [CudaOrder::FastestFirst, CudaOrder::PciBusId] {
            let m = map_cuda_devices(order, None, &uniform());
            assert_eq!(nvml(&m), vec![Some(0), Some(1), Some(2), Some(3)]);
        }
        let m = map_cuda_devices(CudaOrder::PciBusId, Some("3,1"), &uniform());
        assert_eq!(nvml(&m), vec![Some(3), Some(1)]);
        assert_eq!(m[0].entry, "3");
    }

    #[test]
    fn a_table_not_in_bus_order_is_mapped_by_bus_id_not_by_position() {
        let mut table = uniform();
        table.swap(0, 2);
        let m = map_cuda_devices(CudaOrder::PciBusId, Some("0,1"), &table);
        assert_eq!(nvml(&m), vec![Some(2), Some(1)]);
    }

    #[test]
    fn mixed_models_under_fastest_first_are_not_guessed() {
        let table = vec![
            gpu("GPU-slow", "00000000:18:00.0", "NVIDIA L4"),
            gpu("GPU-fast", "00000000:3B:00.0", "NVIDIA H200"),
        ];
        let m = map_cuda_devices(CudaOrder::FastestFirst, None, &table);
        assert!(
            m.iter().all(|g| matches!(&g.mapped, Mapped::Unresolved(why)
            if why.contains("CUDA_DEVICE_ORDER=PCI_BUS_ID"))),
            "{m:?}"
        );
        // UUIDs and the PCI order still resolve.
        let m = map_cuda_devices(CudaOrder::FastestFirst, Some("GPU-fast,GPU-slow"), &table);
        assert_eq!(nvml(&m), vec![Some(1), Some(0)]);
        let m = map_cuda_devices(CudaOrder::from_env(Some("PCI_BUS_ID")), None, &table);
        assert_eq!(nvml(&m), vec![Some(0), Some(1)]);
    }

    #[test]
    fn uuid_and_mig_entries_are_shown_as_such_and_invalid_entries_end_the_list() {
        let table = uniform();
        let m = map_cuda_devices(
            CudaOrder::FastestFirst,
            Some("GPU-cccc,MIG-1f2e3d4c-aaaa,0"),
            &table,
        );
        assert_eq!(
            m.iter().map(|g| g.mapped.clone()).collect::<Vec<_>>(),
            vec![
                Mapped::Nvml(2),
                Mapped::Mig("MIG-1f2e3d4c-aaaa".into()),
                Mapped::Nvml(0)
            ]
        );
        assert!(
            m[0].describe(&table).contains("GPU-cccc-3"),
            "{}",
            m[0].describe(&table)
        );
        assert!(m[1]
            .describe(&table)
            .contains("MIG-1f2e3d4c-aaaa (a MIG instance"));
        // Out of range, unknown UUID, ambiguous prefix, garbage, a repeat: CUDA stops there.
        for (visible, kept) in [
            ("1,9,0", 1),
            ("GPU-zzzz,0", 0),
            ("GPU-,0", 0),
            ("2,x,0", 1),
            ("1,1,0", 1),
            ("", 0),
        ] {
            assert_eq!(
                map_cuda_devices(CudaOrder::PciBusId, Some(visible), &table).len(),
                kept,
                "{visible}"
            );
        }
    }

    #[test]
    fn unset_order_is_cuda_s_default() {
        assert_eq!(CudaOrder::from_env(None), CudaOrder::FastestFirst);
        assert_eq!(
            CudaOrder::from_env(Some("FASTEST_FIRST")),
            CudaOrder::FastestFirst
        );
        assert_eq!(
            CudaOrder::from_env(Some(" PCI_BUS_ID ")),
            CudaOrder::PciBusId
        );
    }
}
