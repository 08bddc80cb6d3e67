"""Tests of the layout check on small crates made in a temporary folder:
what it must refuse (a circle, an oversized file, a file without a module
doc) and what it must let through (test code, comments, re-exported
children, `super::` paths to a sibling)."""

import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

CHECK = Path(__file__).with_name("check_layout.py")


def run(files: dict) -> subprocess.CompletedProcess:
    root = Path(tempfile.mkdtemp())
    for rel, text in files.items():
        path = root / "c" / "src" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return subprocess.run(
        [sys.executable, str(CHECK), "--root", str(root), "c"],
        capture_output=True,
        text=True,
    )


class LayoutCheck(unittest.TestCase):
    def test_a_clean_crate_passes(self):
        r = run({
            "lib.rs": "//! Root.\npub mod a;\npub mod b;\npub use a::A;\n",
            "a.rs": "//! A.\nuse crate::b::B;\npub struct A(B);\n",
            "b.rs": "//! B.\npub struct B;\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}\n",
        })
        self.assertEqual(r.returncode, 0, r.stdout)
        self.assertIn("no circle", r.stdout)

    def test_a_circle_between_siblings_fails_and_is_named(self):
        r = run({
            "lib.rs": "//! Root.\npub mod a;\npub mod b;\n",
            "a.rs": "//! A.\nuse crate::b::B;\npub struct A;\n",
            "b.rs": "//! B.\npub fn f() { let _ = crate::a::A; }\npub struct B;\n",
        })
        self.assertEqual(r.returncode, 1)
        self.assertIn("import circle among 2 files", r.stdout)

    def test_a_child_using_its_parent_that_uses_it_is_a_circle(self):
        r = run({
            "lib.rs": "//! Root.\npub mod p;\n",
            "p/mod.rs": "//! P.\nmod c;\npub use c::C;\npub struct Shared;\n",
            "p/c.rs": "//! C.\nuse super::Shared;\npub struct C(Shared);\n",
        })
        self.assertEqual(r.returncode, 1)
        self.assertIn("p/mod.rs", r.stdout)

    def test_a_folder_used_by_a_module_it_uses_is_a_circle(self):
        r = run({
            "lib.rs": "//! Root.\npub mod f;\npub mod m;\n",
            "f/mod.rs": "//! F.\npub mod x;\npub mod y;\n",
            "f/x.rs": "//! X.\nuse crate::m::M;\npub struct X(M);\n",
            "f/y.rs": "//! Y.\npub struct Y;\n",
            "m.rs": "//! M.\nuse crate::f::y::Y;\npub struct M(Y);\n",
        })
        self.assertEqual(r.returncode, 1, r.stdout)
        self.assertIn("import circle among the top-level modules", r.stdout)
        self.assertNotIn("import circle among 2 files", r.stdout)

    def test_a_circle_through_test_code_only_is_not_one(self):
        r = run({
            "lib.rs": "//! Root.\npub mod a;\npub mod b;\n",
            "a.rs": "//! A.\nuse crate::b::B;\npub struct A(B);\n",
            "b.rs": "//! B.\npub struct B;\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n    #[test]\n    fn t() { let _ = crate::a::A(crate::b::B); }\n}\n",
        })
        self.assertEqual(r.returncode, 0, r.stdout)

    def test_code_over_the_limit_fails_but_comments_and_tests_do_not_count(self):
        code = "//! Big.\n" + "pub fn f() {}\n" * 701
        r = run({"lib.rs": "//! Root.\npub mod big;\n", "big.rs": code})
        self.assertEqual(r.returncode, 1)
        self.assertIn("701 lines of non-test code", r.stdout)
        padded = (
            "//! Not big.\n" + "// a comment\n\n" * 500 + "pub fn f() {}\n" * 690
            + "#[cfg(test)]\nmod tests {\n" + "    fn t() {}\n" * 500 + "}\n"
        )
        r = run({"lib.rs": "//! Root.\npub mod big;\n", "big.rs": padded})
        self.assertEqual(r.returncode, 0, r.stdout)

    def test_a_file_without_a_module_doc_fails(self):
        r = run({"lib.rs": "//! Root.\npub mod a;\n", "a.rs": "pub struct A;\n"})
        self.assertEqual(r.returncode, 1)
        self.assertIn("no `//!` module doc", r.stdout)


if __name__ == "__main__":
    unittest.main()
