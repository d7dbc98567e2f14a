# Sourced by install.sh, semsoft.sh and test.sh: picks the interpreter semsoft runs in.
#   $PYTHON, if set;
#   else the active virtual environment ($VIRTUAL_ENV), which a user keeps using;
#   else the checkout's own .venv, created on first use.
# Never the system interpreter: installing there changes the user's system packages
# (and Debian/Ubuntu refuse it as "externally managed").
semsoft_python() {
  local root="$1"
  if [ -n "${PYTHON:-}" ]; then
    echo "$PYTHON"
  elif [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
    echo "$VIRTUAL_ENV/bin/python"
  else
    if [ ! -x "$root/.venv/bin/python" ]; then
      echo "semsoft: creating the virtual environment $root/.venv (first run)" >&2
      if ! python3 -m venv "$root/.venv" >&2; then
        echo "semsoft: could not create $root/.venv with 'python3 -m venv' (Debian/Ubuntu: apt install python3-venv), or set PYTHON=/path/to/python" >&2
        return 1
      fi
    fi
    echo "$root/.venv/bin/python"
  fi
}
