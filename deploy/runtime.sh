#!/usr/bin/env bash
# The runtime stage of the container image: Debian's MPICH runtime and OpenSSH, one user.
#
#   deploy/runtime.sh install        # deploy/Dockerfile's runtime stage runs this (as root)
#   deploy/runtime.sh check BINARY   # CI: the same package list resolves on this Debian, and
#                                    # every shared library BINARY needs is shipped by it
#
# Packages, and why each is there:
#   mpich            MPICH's runtime: libmpich12 (the library dualpipe links), the Hydra launcher
#                    (`mpiexec`, on the MPIJob's launcher) and `hydra_pmi_proxy` (on each worker);
#   openssh-server   the MPI Operator's launcher starts Hydra's proxy on each worker over ssh;
#   openssh-client   ... from the launcher.
# `--no-install-recommends` keeps MPICH's recommended libmpich-dev (headers, compilers) out.
set -euo pipefail

RUNTIME_PACKAGES=(mpich openssh-server openssh-client)
# The user the pods run as (the MPIJob's runAsUser / sshAuthMountPath follow from it).
USER_NAME=dualpipe
USER_ID=1000

install_runtime() {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${RUNTIME_PACKAGES[@]}"
    rm -rf /var/lib/apt/lists/*
    # sshd wants its privilege separation directory even when it runs as a user.
    mkdir -p -m 0755 /run/sshd
    useradd --create-home --uid "$USER_ID" --user-group --shell /bin/bash "$USER_NAME"
    # No password, but not "locked" ("!"): sshd without PAM refuses even key logins to a
    # locked account.
    usermod --password '*' "$USER_NAME"
    # sshd runs as that user (not root) with its own configuration: the host key is the job's
    # key that the MPI Operator mounts (read-only, owned by root, hence StrictModes no), its pid
    # file lives in /tmp (the root file system is read-only in the pods).
    install -m 0644 /dev/stdin /etc/ssh/sshd_config.dualpipe <<CONFIG
Port 22
HostKey /home/$USER_NAME/.ssh/id_rsa
AuthorizedKeysFile /home/$USER_NAME/.ssh/authorized_keys
PidFile /tmp/sshd.pid
StrictModes no
UsePAM no
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers $USER_NAME
CONFIG
    # The launcher reaches workers it has never seen: their host keys are the job's own key,
    # and known_hosts cannot be written on a read-only file system.
    install -m 0644 /dev/stdin /etc/ssh/ssh_config.d/dualpipe.conf <<CONFIG
Host *
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
CONFIG
}

check_runtime() {
    local binary=$1
    [ -f "$binary" ] || { echo "runtime.sh check: $binary is not a file" >&2; exit 1; }
    # The packages exist here and resolve (a dry run: nothing is installed or configured).
    apt-get install -s -qq --no-install-recommends "${RUNTIME_PACKAGES[@]}" >/dev/null \
        || { echo "runtime.sh check: the runtime packages do not resolve: ${RUNTIME_PACKAGES[*]}" >&2; exit 1; }
    # Everything the runtime image will hold: the packages, their dependencies (no recommends),
    # and the slim base image's own essential packages.
    local closure
    closure=$( (apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
                   --no-breaks --no-replaces --no-enhances "${RUNTIME_PACKAGES[@]}" | grep -v "^ " | grep -v "^<";
               dpkg-query -W -f='${Package} ${Essential} ${Priority}\n' | awk '$2 == "yes" || $3 == "required" {print $1}') \
             | sed 's/:.*//' | sort -u)
    local failed=0 lib path package
    while read -r lib path; do
        # dpkg knows a library by the path its package ships (/lib or /usr/lib: usrmerge).
        package=$(dpkg-query -S "$path" 2>/dev/null | head -1 | cut -d: -f1 || true)
        [ -n "$package" ] || package=$(dpkg-query -S "$(readlink -f "$path")" 2>/dev/null | head -1 | cut -d: -f1 || true)
        if [ -z "$package" ]; then
            echo "runtime.sh check: $lib ($path) belongs to no Debian package" >&2
            failed=1
        elif ! grep -qx "$package" <<<"$closure"; then
            echo "runtime.sh check: $lib comes from $package, which the runtime image does not install" >&2
            failed=1
        else
            echo "     $lib <- $package"
        fi
    done < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
    [ "$failed" -eq 0 ] || exit 1
    echo "runtime.sh check: every shared library of $binary is in the runtime packages (${RUNTIME_PACKAGES[*]})"
}

case "${1:-}" in
    install) install_runtime ;;
    check) [ $# -eq 2 ] || { echo "usage: deploy/runtime.sh check BINARY" >&2; exit 2; }; check_runtime "$2" ;;
    *) echo "usage: deploy/runtime.sh install | check BINARY" >&2; exit 2 ;;
esac
