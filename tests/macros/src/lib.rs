//! `#[flatnet_test]`: an integration test of flatnet's, with what it needs
//! to run stated on it.
//!
//! ```ignore
//! #[flatnet_test(root, tools = ["iperf3", "/usr/lib/cni/bandwidth"])]
//! fn pods_talk() { ... }
//! ```
//!
//! expands to a `#[test]` that first enters its file's gate (the tests of
//! one file run side by side, files one after another, as when each file
//! was a binary of its own), then checks its needs with
//! `flatnet_tests::requirements` under the test's own name: root, and each
//! tool (an absolute path, or a program on PATH). What is missing skips the
//! test loudly for a developer's `cargo test` and fails it under `cargo
//! xtask test` and CI (`flatnet_harness::require`).

use proc_macro::TokenStream;
use quote::quote;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ItemFn, Meta, Token, parse_macro_input};

/// What a test asked for in its attribute.
#[derive(Default)]
struct Needs {
    root: bool,
    tools: Option<Expr>,
}

fn parse_needs(args: proc_macro2::TokenStream) -> syn::Result<Needs> {
    let mut needs = Needs::default();
    let metas = Punctuated::<Meta, Token![,]>::parse_terminated.parse2(args)?;
    for meta in metas {
        match &meta {
            Meta::Path(path) if path.is_ident("root") => needs.root = true,
            Meta::NameValue(pair) if pair.path.is_ident("tools") => {
                needs.tools = Some(pair.value.clone());
            }
            other => {
                return Err(syn::Error::new_spanned(
                    other,
                    "flatnet_test takes `root` and `tools = [\"tool\", ...]`",
                ));
            }
        }
    }
    Ok(needs)
}

#[proc_macro_attribute]
pub fn flatnet_test(args: TokenStream, item: TokenStream) -> TokenStream {
    let needs = match parse_needs(args.into()) {
        Ok(needs) => needs,
        Err(err) => return err.to_compile_error().into(),
    };
    let function = parse_macro_input!(item as ItemFn);
    let ItemFn {
        attrs,
        vis,
        sig,
        block,
    } = function;
    let name = sig.ident.to_string();
    let root = needs.root;
    let tools = match needs.tools {
        Some(tools) => quote!(#tools),
        None => quote!([] as [&str; 0]),
    };
    quote! {
        #[test]
        #(#attrs)*
        #vis #sig {
            let _gate = ::flatnet_tests::gate::enter(module_path!());
            if !::flatnet_tests::requirements(#name, #root, &(#tools)) {
                return;
            }
            #block
        }
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_are_read_from_the_attribute() {
        let needs = parse_needs(quote!(root, tools = ["iperf3", "tcpdump"])).unwrap();
        assert!(needs.root);
        assert!(needs.tools.is_some());
        let none = parse_needs(quote!()).unwrap();
        assert!(!none.root && none.tools.is_none());
    }

    #[test]
    fn anything_else_is_refused_with_what_it_takes() {
        let err = parse_needs(quote!(root, network)).err().unwrap();
        assert!(err.to_string().contains("takes `root`"), "{err}");
    }
}
