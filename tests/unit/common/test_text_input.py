"""Text taken at the boundary: control characters, environment variable names, the
agent's variables (:mod:`accelshare.common.text_input`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from accelshare.common import CommonValueError
from accelshare.common.text_input import (
    check_env_name,
    check_text,
    find_control,
    reserved_env_reason,
)

CONTROLS = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))]
PRINTABLE = st.text(st.characters(blacklist_categories=("Cc",)))


@pytest.mark.parametrize("char", CONTROLS)
def test_every_control_character_is_refused_in_single_line_text(char: str) -> None:
    with pytest.raises(CommonValueError) as caught:
        check_text(f"ab{char}c", field="email")
    error = caught.value
    assert (error.field, error.received) == ("email", f"ab{char}c")
    assert f"U+{ord(char):04X} at position 2" in str(error)
    assert "expected text without NUL or control characters" in str(error)


@pytest.mark.parametrize("char", ["\t", "\n", "\r"])
def test_tabs_and_line_breaks_are_allowed_in_multi_line_text_only(char: str) -> None:
    assert check_text(f"echo a{char}echo b", field="startupCommand", multiline=True)
    assert find_control(f"a{char}", multiline=False) == 1


def test_nul_is_refused_in_multi_line_text() -> None:
    with pytest.raises(CommonValueError, match=r"U\+0000 at position 4.*line feed"):
        check_text("echo\x00rm", field="startupCommand", multiline=True)


@given(PRINTABLE)
def test_text_without_control_characters_is_kept_as_is(text: str) -> None:
    assert check_text(text, field="f") == text
    assert find_control(text) is None


@given(PRINTABLE, st.sampled_from(CONTROLS), PRINTABLE)
def test_the_first_control_character_is_found_where_it_is(head: str, char: str, tail: str) -> None:
    assert find_control(head + char + tail) == len(head)
    expected = None if char in "\t\n\r" else len(head)
    assert find_control(head + char + tail, multiline=True) == expected


@pytest.mark.parametrize("name", ["A", "_x", "PATH", "my_var_2", "BACKENDAI_SERVICE_PORT_WEB"])
def test_posix_names_a_request_may_set(name: str) -> None:
    assert check_env_name(name, field="config.environ") == name
    assert reserved_env_reason(name) is None


@pytest.mark.parametrize("name", ["", "1A", "A-B", "A B", "A=B", "A\x00", "A\n", "É", "A.B"])
def test_names_that_are_not_posix_names_are_refused(name: str) -> None:
    with pytest.raises(CommonValueError) as caught:
        check_env_name(name, field=f"config.environ.{name}")
    assert caught.value.expected == "a POSIX variable name: [A-Za-z_][A-Za-z0-9_]*"
    assert caught.value.received == name


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_MPS_PIPE_DIRECTORY",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "BACKENDAI_MOCK_CUDA_DEVICES",
        "BACKENDAI_MOCK_CUDA_DEVICE_COUNT",
        "BACKENDAI_KERNEL_ID",
        "ACCELSHARE_RESOURCE_TXT",
        "ACCELSHARE_SESSION_ID",
    ],
)
def test_the_agents_variables_are_refused_naming_them(name: str) -> None:
    with pytest.raises(CommonValueError) as caught:
        check_env_name(name, field=f"config.environ.{name}")
    message = str(caught.value)
    assert message.startswith(f"config.environ.{name}: {name} is set by the agent")
    assert message.endswith("a request cannot set it")
    assert caught.value.received == name


@given(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]*", fullmatch=True))
def test_a_posix_name_is_accepted_unless_it_is_the_agents(name: str) -> None:
    if reserved_env_reason(name) is None:
        assert check_env_name(name, field="f") == name
    else:
        with pytest.raises(CommonValueError):
            check_env_name(name, field="f")
