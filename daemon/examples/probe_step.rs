use std::time::Instant;
use dflashd::engine::train::{embedded, Trainer};
use tch::Device;

fn main() {
    let threads: i32 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    tch::set_num_threads(threads);
    let target = embedded::tiny_target(None, Device::Cpu).unwrap();
    let cfg = embedded::tiny_train_config();
    let (samples, _) = embedded::tiny_samples(512, cfg.max_len).unwrap();
    let dcfg = embedded::tiny_drafter_config(target.config());
    let mut t = Trainer::new(target, dcfg, samples, cfg, Device::Cpu).unwrap();
    for i in 0..12 {
        let s = Instant::now();
        let m = t.train_step().unwrap();
        println!("step {i} total {:.0}ms target {:.0} drafter {:.0} opt {:.0} loss {:.3}", s.elapsed().as_secs_f64()*1e3, m.times.target_forward_ms, m.times.drafter_forward_backward_ms, m.times.optimizer_ms, m.loss);
    }
    let s = Instant::now();
    let r = t.evaluate_held_out().unwrap().unwrap();
    println!("eval {:.0}ms tau {:.3} loss {:.3} blocks {}", s.elapsed().as_secs_f64()*1e3, r.tau, r.loss, r.blocks);
}
