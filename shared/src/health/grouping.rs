//! Sibling alerts folded into one line: `memory:gpu0` … `memory:gpu4`, each "GPU n memory
//! volatile", read "GPU 0–4 memory volatile". Pure, so the console's Alerts panel, the status
//! report and the daemon's explanations fold them the same way.
//!
//! The rule: an item folds with others when its detector is `memory:gpuN` and its headline
//! begins "GPU N " (its own index); the wording is what follows, up to a ": " that starts the
//! figures (which differ GPU by GPU and are dropped from a folded line unless they are all the
//! same). Items with the same wording fold into the place of the first of them; every other
//! item is kept as it is, in order.

/// One line of a grouped list: which input items it folds (indices, in input order) and its
/// words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grouped {
    pub members: Vec<usize>,
    pub headline: String,
}

/// The GPU index of a `memory:gpuN` detector.
pub fn memory_gpu(detector: &str) -> Option<u32> {
    detector.strip_prefix("memory:gpu")?.parse().ok()
}

/// Indices as ranges: `[0, 1, 2, 5]` → "0–2, 5"; `[3, 4]` → "3–4"; unsorted input is sorted
/// and duplicates dropped.
pub fn index_ranges(indices: &[u32]) -> String {
    let mut sorted = indices.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}–{end}")
        });
        i += 1;
    }
    parts.join(", ")
}

/// (gpu, wording, figures) of a foldable item.
fn split_gpu_headline(detector: &str, headline: &str) -> Option<(u32, String, Option<String>)> {
    let gpu = memory_gpu(detector)?;
    let rest = headline.strip_prefix(&format!("GPU {gpu} "))?;
    Some(match rest.split_once(": ") {
        Some((wording, figures)) => (gpu, wording.to_string(), Some(figures.to_string())),
        None => (gpu, rest.to_string(), None),
    })
}

/// Folds `(detector, headline)` items; see the module's rule.
pub fn group(items: &[(&str, &str)]) -> Vec<Grouped> {
    let parsed: Vec<_> = items
        .iter()
        .map(|(d, h)| split_gpu_headline(d, h))
        .collect();
    let mut out: Vec<Grouped> = Vec::new();
    let mut taken = vec![false; items.len()];
    for i in 0..items.len() {
        if taken[i] {
            continue;
        }
        taken[i] = true;
        let Some((_, wording, _)) = &parsed[i] else {
            out.push(Grouped {
                members: vec![i],
                headline: items[i].1.to_string(),
            });
            continue;
        };
        let mut members = vec![i];
        for j in i + 1..items.len() {
            if !taken[j] && parsed[j].as_ref().is_some_and(|(_, w, _)| w == wording) {
                taken[j] = true;
                members.push(j);
            }
        }
        if members.len() == 1 {
            out.push(Grouped {
                members,
                headline: items[i].1.to_string(),
            });
            continue;
        }
        let gpus: Vec<u32> = members
            .iter()
            .filter_map(|&m| parsed[m].as_ref().map(|p| p.0))
            .collect();
        let figures: Vec<&Option<String>> = members
            .iter()
            .filter_map(|&m| parsed[m].as_ref().map(|p| &p.2))
            .collect();
        let same_figures = figures.windows(2).all(|w| w[0] == w[1]);
        let mut headline = format!("GPU {} {wording}", index_ranges(&gpus));
        if let (true, Some(Some(f))) = (same_figures, figures.first()) {
            headline.push_str(": ");
            headline.push_str(f);
        }
        out.push(Grouped { members, headline });
    }
    out
}

/// The folded lines alone: `[("memory:gpu0", "GPU 0 memory volatile"), …, ("memory:gpu4",
/// "GPU 4 memory volatile")]` → `["GPU 0–4 memory volatile"]`.
pub fn group_detectors(items: &[(&str, &str)]) -> Vec<String> {
    group(items).into_iter().map(|g| g.headline).collect()
}

/// Sentences without a detector ("GPU 5 memory volatile at 21:02", the precursors of an
/// alert) folded the same way when they differ only in the GPU: "GPU 5–7 memory volatile at
/// 21:02". Other sentences are kept, in order.
pub fn group_gpu_sentences(sentences: &[String]) -> Vec<String> {
    let detectors: Vec<String> = sentences
        .iter()
        .map(|s| {
            s.strip_prefix("GPU ")
                .and_then(|rest| rest.split_once(' '))
                .and_then(|(n, _)| n.parse::<u32>().ok())
                .map_or_else(String::new, |n| format!("memory:gpu{n}"))
        })
        .collect();
    // A sentence has no figures to drop: fold only on the whole wording.
    let guarded: Vec<String> = sentences
        .iter()
        .map(|s| s.replace(": ", ":\u{0}"))
        .collect();
    let items: Vec<(&str, &str)> = detectors
        .iter()
        .zip(&guarded)
        .map(|(d, s)| (d.as_str(), s.as_str()))
        .collect();
    group(&items)
        .into_iter()
        .map(|g| g.headline.replace(":\u{0}", ": "))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_use_an_en_dash_and_commas() {
        assert_eq!(index_ranges(&[0, 1, 2, 5]), "0–2, 5");
        assert_eq!(index_ranges(&[7, 5, 6, 5]), "5–7");
        assert_eq!(index_ranges(&[1, 3]), "1, 3");
        assert_eq!(index_ranges(&[]), "");
    }

    #[test]
    fn sibling_gpus_with_the_same_wording_fold_into_one_line() {
        let items = [
            ("throughput", "4.3K tok/s, Crit since 21:03"),
            ("memory:gpu0", "GPU 0 memory volatile: range 3.1 GB"),
            ("memory:gpu1", "GPU 1 memory volatile: range 2.9 GB"),
            ("queue", "queue imbalance: drafter-bound"),
            ("memory:gpu2", "GPU 2 memory volatile: range 3.0 GB"),
            ("memory:gpu5", "GPU 5 memory volatile: range 8.0 GB"),
            ("memory:gpu4", "GPU 4 memory flat again"),
        ];
        let grouped = group(&items);
        assert_eq!(
            grouped
                .iter()
                .map(|g| g.headline.as_str())
                .collect::<Vec<_>>(),
            [
                "4.3K tok/s, Crit since 21:03",
                "GPU 0–2, 5 memory volatile",
                "queue imbalance: drafter-bound",
                "GPU 4 memory flat again",
            ]
        );
        assert_eq!(grouped[1].members, [1, 2, 4, 5]);
        assert_eq!(
            group_detectors(&[
                ("memory:gpu3", "GPU 3 memory volatile"),
                ("memory:gpu4", "GPU 4 memory volatile"),
            ]),
            ["GPU 3–4 memory volatile"]
        );
    }

    #[test]
    fn a_lone_gpu_keeps_its_figures_and_shared_figures_are_kept() {
        assert_eq!(
            group_detectors(&[("memory:gpu3", "GPU 3 memory volatile: range 3.1 GB")]),
            ["GPU 3 memory volatile: range 3.1 GB"]
        );
        assert_eq!(
            group_detectors(&[
                ("memory:gpu0", "GPU 0 memory volatile: 2 retries"),
                ("memory:gpu1", "GPU 1 memory volatile: 2 retries"),
            ]),
            ["GPU 0–1 memory volatile: 2 retries"]
        );
        // A headline that does not name its own GPU is not folded.
        assert_eq!(
            group_detectors(&[
                ("memory:gpu0", "GPU 1 memory volatile"),
                ("memory:gpu1", "GPU 1 memory volatile"),
            ]),
            ["GPU 1 memory volatile", "GPU 1 memory volatile"]
        );
    }

    #[test]
    fn precursor_sentences_fold_when_only_the_gpu_differs() {
        let sentences = [
            "torch 2.11.0+cu128 → 2.9.1+cu130 at 20:52".to_string(),
            "GPU 5 memory volatile at 21:02".to_string(),
            "GPU 6 memory volatile at 21:02".to_string(),
            "GPU 7 memory volatile at 21:03".to_string(),
        ];
        assert_eq!(
            group_gpu_sentences(&sentences),
            [
                "torch 2.11.0+cu128 → 2.9.1+cu130 at 20:52",
                "GPU 5–6 memory volatile at 21:02",
                "GPU 7 memory volatile at 21:03",
            ]
        );
    }
}
