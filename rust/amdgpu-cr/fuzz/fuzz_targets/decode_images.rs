//! Feeds arbitrary bytes to the image decoders, and whatever decodes to the
//! topology conversion and the matcher (image against itself).
#![no_main]

use amdgpu_cr::env::Checks;
use amdgpu_cr::image::{KfdImage, RenderImage};
use amdgpu_cr::matcher::match_gpus;
use amdgpu_cr::topology::Topology;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = RenderImage::decode("fuzz", data);
    let Ok(img) = KfdImage::decode("fuzz", data) else {
        return;
    };
    // Re-encoding a valid image must give an image that decodes the same.
    let again = KfdImage::decode("fuzz", &img.encode()).expect("re-encoded image decodes");
    assert_eq!(again, img);
    if let Ok(t) = Topology::from_image_entries(&img.msg.device_entries) {
        let _ = t.hives();
        // Keep the matcher's worst case small: it is exponential by nature.
        // A topology always matches itself (the identity is a solution).
        if t.gpus().count() <= 8 {
            match match_gpus(&t, &t, &Checks::default()) {
                Ok(map) => assert_eq!(map.len(), t.gpus().count()),
                Err(amdgpu_cr::matcher::MatchError::SearchLimit(_)) => {}
                Err(e) => panic!("image topology does not match itself: {e}"),
            }
        }
    }
});
