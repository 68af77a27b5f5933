//! Dense BF16 tensor-core peaks of the GPUs whose datasheets we cite, by NVML device name:
//! what a CUDA worker's MFU is measured against. These are vendor figures, not readings;
//! a GPU missing from the table has no peak, so the daemon says so and reports no MFU for it.
//!
//! NVIDIA's datasheets give BF16 "with sparsity" (2:4 structured sparsity, which DFlash
//! training does not use); the dense figure is half of it.

/// One datasheet peak.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DatasheetPeak {
    /// The model the figure is for, e.g. "H200 SXM".
    pub model: &'static str,
    /// Dense BF16 tensor-core FLOP/s.
    pub bf16_dense_flops_per_s: f64,
    /// Where the figure comes from.
    pub source: &'static str,
}

const H100_SXM: DatasheetPeak = DatasheetPeak {
    model: "H100 SXM",
    bf16_dense_flops_per_s: 989.5e12,
    source:
        "NVIDIA H100 Tensor Core GPU datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity (SXM)",
};
const H100_PCIE: DatasheetPeak = DatasheetPeak {
    model: "H100 PCIe",
    bf16_dense_flops_per_s: 756.5e12,
    source:
        "NVIDIA H100 Tensor Core GPU datasheet: BF16 Tensor Core 1,513 TFLOPS with sparsity (PCIe)",
};
const H200_SXM: DatasheetPeak = DatasheetPeak {
    model: "H200 SXM",
    bf16_dense_flops_per_s: 989.5e12,
    source:
        "NVIDIA H200 Tensor Core GPU datasheet: BF16 Tensor Core 1,979 TFLOPS with sparsity (SXM)",
};
const A100: DatasheetPeak = DatasheetPeak {
    model: "A100",
    bf16_dense_flops_per_s: 312e12,
    source: "NVIDIA A100 Tensor Core GPU datasheet: BF16 Tensor Core 312 TFLOPS dense (624 with sparsity)",
};

/// The datasheet peak for an NVML device name ("NVIDIA H200", "NVIDIA H100 80GB HBM3",
/// "NVIDIA A100-SXM4-80GB"), or `None` for a GPU the table does not cite, including form
/// factors whose figure differs and is not in it (H100 NVL, H200 NVL).
pub fn datasheet_peak(nvml_name: &str) -> Option<DatasheetPeak> {
    let name = nvml_name.to_ascii_uppercase();
    if name.contains("NVL") {
        return None;
    }
    if name.contains("H200") {
        Some(H200_SXM)
    } else if name.contains("H100") {
        if name.contains("PCIE") {
            Some(H100_PCIE)
        } else if name.contains("HBM3") || name.contains("SXM") {
            Some(H100_SXM)
        } else {
            None
        }
    } else if name.contains("A100") {
        Some(A100)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_names_map_to_their_datasheet_and_others_to_none() {
        let model = |n: &str| datasheet_peak(n).map(|p| p.model);
        assert_eq!(model("NVIDIA H200"), Some("H200 SXM"));
        assert_eq!(model("NVIDIA H100 80GB HBM3"), Some("H100 SXM"));
        assert_eq!(model("NVIDIA H100 PCIe"), Some("H100 PCIe"));
        assert_eq!(model("NVIDIA A100-SXM4-80GB"), Some("A100"));
        assert_eq!(model("NVIDIA A100 80GB PCIe"), Some("A100"));
        // Not cited: no figure rather than a neighbour's.
        assert_eq!(model("NVIDIA H200 NVL"), None);
        assert_eq!(model("NVIDIA H100 NVL"), None);
        assert_eq!(model("NVIDIA RTX PRO 6000 Blackwell Server Edition"), None);
        assert_eq!(model("NVIDIA GeForce RTX 4090"), None);
    }

    #[test]
    fn dense_is_half_the_sparse_figure_the_source_quotes() {
        for p in [H100_SXM, H100_PCIE, H200_SXM] {
            let sparse: f64 = p
                .source
                .split("BF16 Tensor Core ")
                .nth(1)
                .and_then(|s| s.split(" TFLOPS").next())
                .map(|s| s.replace(',', "").parse().unwrap())
                .unwrap();
            assert_eq!(p.bf16_dense_flops_per_s, sparse * 1e12 / 2.0, "{}", p.model);
        }
    }
}
