"""Every `make revert-checks` entry still applies to the code it reverts: its
original text is in its file exactly once and the tests it names exist. A merge
that moves the text would otherwise turn the entry into an error, not a proof."""

import re
from pathlib import Path

import pytest

from tests.revert_checks import MUTATIONS, PROJECT


@pytest.mark.parametrize("index", range(len(MUTATIONS)))
def test_each_revert_check_finds_its_text_once_and_names_tests_that_exist(index):
    description, path, original, _replacement, tests = MUTATIONS[index][:5]
    source = (PROJECT / path).read_text()
    assert source.count(original) == 1, f"{index} {description}: its text is in {path} {source.count(original)} times"
    for test_id in tests.split():
        file, _, name = test_id.partition("::")
        assert (PROJECT / file).exists(), f"{index} {description}: no {file}"
        if name:
            function = name.split("[")[0]
            assert re.search(rf"def {re.escape(function)}\b", Path(PROJECT / file).read_text()), (
                f"{index} {description}: no test {test_id}"
            )
