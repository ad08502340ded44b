//! Gives libupager.so the soname `libupager.so.0`, so that a program linked
//! with `-lupager` or with `-lumap` (libumap.so is a symlink to it) records
//! `libupager.so.0` and finds it next to the other names at run time.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libupager.so.0");
}
