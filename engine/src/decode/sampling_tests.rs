use super::*;
use tch::Device;

fn logits(values: &[f64]) -> Tensor {
    Tensor::from_slice(values)
        .to_kind(Kind::Float)
        .to_device(Device::Cpu)
}

#[test]
fn greedy_is_one_hot_on_the_first_maximum() {
    assert_eq!(
        distribution(&logits(&[0.0, 2.0, 2.0, 1.0]), Sampling::Greedy),
        vec![0.0, 1.0, 0.0, 0.0]
    );
}

#[test]
fn temperature_top_k_and_top_p_restrict_and_renormalise() {
    let l = logits(&[3.0, 1.0, 2.0, 0.0]);
    let plain = distribution(
        &l,
        Sampling::Sample {
            temperature: 1.0,
            top_k: None,
            top_p: None,
        },
    );
    let e: Vec<f64> = [3.0f64, 1.0, 2.0, 0.0].iter().map(|x| x.exp()).collect();
    let z: f64 = e.iter().sum();
    for (got, want) in plain.iter().zip(e.iter().map(|x| x / z)) {
        assert!((got - want).abs() < 1e-6);
    }
    let top2 = distribution(
        &l,
        Sampling::Sample {
            temperature: 1.0,
            top_k: Some(2),
            top_p: None,
        },
    );
    assert!(top2[1] == 0.0 && top2[3] == 0.0);
    assert!((top2[0] - e[0] / (e[0] + e[2])).abs() < 1e-6);
    // top-p 0.6: token 0 alone has 0.64 of the mass
    let nucleus = distribution(
        &l,
        Sampling::Sample {
            temperature: 1.0,
            top_k: None,
            top_p: Some(0.6),
        },
    );
    assert_eq!(nucleus, vec![1.0, 0.0, 0.0, 0.0]);
    let cold = distribution(
        &l,
        Sampling::Sample {
            temperature: 0.25,
            top_k: None,
            top_p: None,
        },
    );
    assert!(cold[0] > plain[0]);
}

#[test]
fn bad_settings_say_what_to_use() {
    let bad = Sampling::Sample {
        temperature: 0.0,
        top_k: None,
        top_p: None,
    };
    assert!(bad
        .validate()
        .unwrap_err()
        .to_string()
        .contains("use greedy"));
    let bad = Sampling::Sample {
        temperature: 1.0,
        top_k: None,
        top_p: Some(1.5),
    };
    assert!(bad.validate().unwrap_err().to_string().contains("(0, 1]"));
}
