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
//!
//! A case run in several settings names them once:
//!
//! ```ignore
//! #[flatnet_test(root, cases(iptables(Mode::Iptables), nftables(Mode::Nftables)))]
//! fn hairpin(mode: Mode) { ... }
//! ```
//!
//! keeps `hairpin` a plain function and adds the tests `hairpin_iptables`
//! and `hairpin_nftables`, each calling it with its arguments.

use proc_macro::TokenStream;
use quote::{format_ident, quote};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Expr, ExprCall, ItemFn, Meta, Token, parse_macro_input};

/// What a test asked for in its attribute.
#[derive(Default)]
struct Needs {
    root: bool,
    tools: Option<Expr>,
    /// `name(arguments)`: one test a case, the function called with them.
    cases: Vec<ExprCall>,
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
            Meta::List(list) if list.path.is_ident("cases") => {
                let cases = Punctuated::<ExprCall, Token![,]>::parse_terminated
                    .parse2(list.tokens.clone())?;
                for case in cases {
                    if !matches!(&*case.func, Expr::Path(path) if path.path.get_ident().is_some()) {
                        return Err(syn::Error::new_spanned(
                            &case.func,
                            "a case is `name(arguments)`, its name one identifier",
                        ));
                    }
                    needs.cases.push(case);
                }
            }
            other => {
                return Err(syn::Error::new_spanned(
                    other,
                    "flatnet_test takes `root`, `tools = [\"tool\", ...]` and `cases(name(arguments), ...)`",
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
    // A test enters its file's gate, then checks its needs under its own name.
    let preamble = |name: &str| {
        quote! {
            let _gate = ::flatnet_tests::gate::enter(module_path!());
            if !::flatnet_tests::requirements(#name, #root, &(#tools)) {
                return;
            }
        }
    };
    if needs.cases.is_empty() {
        let preamble = preamble(&name);
        return quote! {
            #[test]
            #(#attrs)*
            #vis #sig {
                #preamble
                #block
            }
        }
        .into();
    }
    let function = &sig.ident;
    let tests = needs.cases.iter().map(|case| {
        let Expr::Path(case_name) = &*case.func else {
            unreachable!("checked in parse_needs")
        };
        let test = format_ident!("{}_{}", function, case_name.path.segments[0].ident);
        let preamble = preamble(&test.to_string());
        let arguments = &case.args;
        quote! {
            #[test]
            fn #test() {
                #preamble
                #function(#arguments);
            }
        }
    });
    quote! {
        #(#attrs)*
        #vis #sig #block
        #(#tests)*
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

    #[test]
    fn cases_are_calls_with_a_plain_name() {
        let needs = parse_needs(quote!(
            root,
            cases(
                iptables(Mode::Iptables),
                xdp(Mode::Nftables, &["--datapath", "xdp"])
            )
        ))
        .unwrap();
        assert_eq!(needs.cases.len(), 2);
        assert_eq!(needs.cases[1].args.len(), 2);
        let err = parse_needs(quote!(cases(a::b(1)))).err().unwrap();
        assert!(err.to_string().contains("one identifier"), "{err}");
    }
}
