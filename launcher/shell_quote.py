"""What bash's `printf %q` prints, without starting bash.

q(value) is bash 5.2's `printf %q VALUE` for the bytes os.fsencode(value), read back with os.fsdecode, in the locale
the process runs in (LC_CTYPE, which Python sets from the environment at start-up, as bash does): exact in UTF-8 locales
and in C/POSIX; other codesets are quoted as in C. bash reads the result back as those bytes.
"""

import ctypes
import locale
import os

# The rules are those of bash's lib/sh/shquote.c and lib/sh/strtrans.c that printf's %q follows: ansic_shouldquote
# picks $'...' for a string with any character that does not print, else sh_backslash_quote (flags 3: tildes too).
# sh_backslash_quote's table: what a backslash protects anywhere in a word.
BACKSLASHED = frozenset(" \t\n!\"$&'(),*;<>?[\\]^`{|}")
# ansic_quote's named escapes; every other character that does not print becomes \NNN octal, one per byte.
ANSI_C_ESCAPES = {"\x1b": "\\E", "\a": "\\a", "\v": "\\v", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
                  "\t": "\\t", "\\": "\\\\", "'": "\\'"}  # fmt: skip
# Unicode's data differs between Python and the C library (Python 3.12 knows Unicode 15, Debian 12's glibc 14), and
# bash asks the C library.
iswprint = ctypes.CDLL(None).iswprint
iswprint.argtypes = (ctypes.c_uint32,)


def q(value: str) -> str:
    """VALUE as bash's `printf %q` writes it: a word that bash reads back as VALUE's bytes."""
    chars = characters(os.fsencode(value))
    if not chars:
        return "''"
    if all(map(prints, chars)):
        return backslash_quoted(chars)
    return "$'" + "".join(map(ansi_c_escaped, chars)) + "'"


def quoted(*values: str) -> list[str]:
    """Each value through q."""
    return [q(value) for value in values]


def characters(data: bytes) -> str:
    """DATA as the locale's characters, where a byte that starts none (invalid UTF-8; in the C locale any byte over
    0x7f) stands alone as its surrogate escape, U+DC80..U+DCFF. The C library resynchronises on the next byte."""
    utf8 = locale.nl_langinfo(locale.CODESET) in ("UTF-8", "utf8")  # bash's own test (locale.c, locale_isutf8)
    return data.decode("utf-8" if utf8 else "ascii", "surrogateescape")


def prints(char: str) -> bool:
    """Whether CHAR is a printable character of the locale; a lone byte never is."""
    if char < "\x80":
        return " " <= char <= "~"
    return not "\udc80" <= char <= "\udcff" and iswprint(ord(char)) != 0


def backslash_quoted(chars: str) -> str:
    """sh_backslash_quote: a backslash before each special character, a leading #, and a ~ that would expand."""
    out = []
    for i, char in enumerate(chars):
        starts_word = i == 0 or chars[i - 1] in ":="  # where tilde expansion looks, as in PATH=~/bin:~/sbin
        if char in BACKSLASHED or (char == "#" and i == 0) or (char == "~" and starts_word):
            out.append("\\")
        out.append(char)
    return "".join(out)


def ansi_c_escaped(char: str) -> str:
    """CHAR inside $'...'."""
    if char in ANSI_C_ESCAPES:
        return ANSI_C_ESCAPES[char]
    if prints(char):
        return char
    return "".join(f"\\{byte:03o}" for byte in char.encode("utf-8", "surrogateescape"))
