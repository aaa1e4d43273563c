# bash completion for mpswrap, generated from its parser: mpswrap completion bash
_mpswrap() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    local cmd="" i=1 words=""
    # --opt=value is three words (COMP_WORDBREAKS has '='): the option is prev
    [ "$prev" = "=" ] && prev=${COMP_WORDS[COMP_CWORD-2]}
    # the command word: the first word after mpswrap's own options (and their values)
    while [ "$i" -lt "$COMP_CWORD" ]; do
        case ${COMP_WORDS[i]} in
            --) cmd=--; break ;;
            --clients|--config|--counts|--cpus|--dest|--dir|--faults|--gpus|--gpus-per-rank|--grace|--halt|--heartbeat|--job|--max|--mem-limit|--modulefile|--node|--np|--per-gpu|--plot|--policy|--priority|--progress|--python|--repeats|--retries|--run-dir|--share|--simulate|--textfile|--threads|--timeout|--user|--verify-attach|--verify-timeout|--watch|-n)
                [ "${COMP_WORDS[i+1]}" = "=" ] && i=$((i + 1))
                i=$((i + 2)); continue ;;
            -*) ;;
            *) cmd=${COMP_WORDS[i]}; break ;;
        esac
        i=$((i + 1))
    done
    # a command of two words (farm status)
    if [ $((i + 1)) -lt "$COMP_CWORD" ]; then
        case "$cmd ${COMP_WORDS[i+1]}" in
            'farm status'|'sim install-bin'|'sim inventory') cmd="$cmd ${COMP_WORDS[i+1]}"; i=$((i + 1)) ;;
        esac
    fi
    # after a -- (run, calibrate) the words are the program's
    while [ $((i += 1)) -lt "$COMP_CWORD" ]; do
        [ "${COMP_WORDS[i]}" = -- ] && cmd=--
    done
    case "$cmd $prev" in
        ' --gpus'|' --threads'|' --mem-limit'|' --verify-timeout'|' --grace'|' --job'|' --gpus-per-rank'|'run -n'|'run --np'|'run --gpus'|'run --threads'|'run --mem-limit'|'run --verify-timeout'|'run --grace'|'run --job'|'run --gpus-per-rank'|'farm --per-gpu'|'farm --retries'|'farm --timeout'|'farm --halt'|'farm --heartbeat'|'farm --share'|'farm --gpus'|'farm --threads'|'farm --mem-limit'|'farm --verify-timeout'|'farm --grace'|'farm --job'|'calibrate --max'|'calibrate --counts'|'calibrate --repeats'|'calibrate --gpus'|'calibrate --mem-limit'|'calibrate --grace'|'calibrate --job'|'start --job'|'start --node'|'start --gpus'|'start --user'|'start --cpus'|'start --threads'|'start --mem-limit'|'stop --job'|'stop --node'|'status --job'|'status --node'|'status --watch'|'metrics --job'|'metrics --node'|'container-args --job'|'demo --clients'|'sim inventory --gpus') COMPREPLY=(); return ;;
        ' --policy'|'run --policy') COMPREPLY=($(compgen -W "block cyclic affinity" -- "$cur")); return ;;
        ' --priority'|'run --priority'|'farm --priority'|'calibrate --priority'|'start --priority') COMPREPLY=($(compgen -W "0 1" -- "$cur")); return ;;
        ' --verify-attach'|'run --verify-attach'|'farm --verify-attach') COMPREPLY=($(compgen -W "warn fail off" -- "$cur")); return ;;
        'farm --dir'|'calibrate --dir'|'start --run-dir'|'stop --run-dir'|'status --run-dir'|'metrics --run-dir'|'metrics --textfile'|'install-hooks --dest'|'install-hooks --modulefile'|'uninstall-hooks --dest'|'uninstall-hooks --modulefile') COMPREPLY=($(compgen -d -- "$cur")); return ;;
        'farm --progress') COMPREPLY=($(compgen -W "auto bar lines off" -- "$cur")); return ;;
        'farm status --plot'|'calibrate --plot'|'start --config'|'stop --config'|'status --config'|'report --config'|'metrics --config'|'config --config'|'container-args --config'|'demo --config'|'prolog --config'|'task-prolog --config'|'epilog --config'|'install-hooks --python'|'install-hooks --config'|'sim install-bin --faults') COMPREPLY=($(compgen -f -- "$cur")); return ;;
        'demo --simulate') COMPREPLY=($(compgen -W "auto yes no" -- "$cur")); return ;;
    esac
    case $cmd in
        "") if [[ $cur == -* ]]; then words="-h --help --gpus --policy --threads --mem-limit --priority --verify-attach --verify-timeout --no-shield --grace --dry-run --job --gpus-per-rank --version -v --verbose -q --quiet --debug"; else words="run farm calibrate start stop status report metrics config container-args demo prolog task-prolog epilog install-hooks uninstall-hooks sim version completion help srun mpirun mpiexec orterun prun prterun torchrun"; fi ;;
        run) words="-h --help -n --np --gpus --policy --threads --mem-limit --priority --verify-attach --verify-timeout --no-shield --grace --dry-run --job --gpus-per-rank --version -v --verbose -q --quiet --debug" ;;
        farm) words="-h --help --per-gpu --retries --timeout --halt --skip-failed --heartbeat --dir --share --progress --tag --gpus --threads --mem-limit --priority --verify-attach --verify-timeout --no-shield --grace --dry-run --job --version -v --verbose -q --quiet --debug"; [[ $cur == -* ]] || { COMPREPLY=($(compgen -f -- "$cur") $(compgen -W "status" -- "$cur")); return; } ;;
        'farm status') words="-h --help --json --failed --plot --version -v --verbose -q --quiet --debug"; [[ $cur == -* ]] || { COMPREPLY=($(compgen -d -- "$cur")); return; } ;;
        calibrate) words="-h --help --max --counts --repeats --plot --json --dir --gpus --mem-limit --priority --grace --dry-run --job --version -v --verbose -q --quiet --debug" ;;
        start) words="-h --help --job --node --run-dir --gpus --user --cpus --threads --mem-limit --priority --prestart --json --config --version -v --verbose -q --quiet --debug" ;;
        stop) words="-h --help --job --node --run-dir --json --config --version -v --verbose -q --quiet --debug" ;;
        status) words="-h --help --job --node --run-dir --json --watch --all --config --version -v --verbose -q --quiet --debug" ;;
        report) words="-h --help --json --config --version -v --verbose -q --quiet --debug" ;;
        metrics) words="-h --help --job --node --run-dir --all --textfile --process-labels --config --version -v --verbose -q --quiet --debug" ;;
        config) words="-h --help --json --config --version -v --verbose -q --quiet --debug" ;;
        container-args) words="-h --help --job --config --version -v --verbose -q --quiet --debug"; [[ $cur == -* ]] || { COMPREPLY=($(compgen -W "podman docker apptainer singularity enroot bwrap" -- "$cur")); return; } ;;
        demo) words="-h --help --clients --simulate --config --version -v --verbose -q --quiet --debug" ;;
        prolog) words="-h --help --config --version -v --verbose -q --quiet --debug" ;;
        task-prolog) words="-h --help --config --version -v --verbose -q --quiet --debug" ;;
        epilog) words="-h --help --config --version -v --verbose -q --quiet --debug" ;;
        install-hooks) words="-h --help --python --config --dest --spank --modulefile --version -v --verbose -q --quiet --debug" ;;
        uninstall-hooks) words="-h --help --dest --modulefile --force --version -v --verbose -q --quiet --debug" ;;
        sim) words="-h --help --version -v --verbose -q --quiet --debug"; [[ $cur == -* ]] || { COMPREPLY=($(compgen -W "install-bin inventory" -- "$cur")); return; } ;;
        version) words="-h --help --version -v --verbose -q --quiet --debug" ;;
        completion) words="-h --help --version -v --verbose -q --quiet --debug"; [[ $cur == -* ]] || { COMPREPLY=($(compgen -W "bash" -- "$cur")); return; } ;;
        help) words="-h --help --man-path --version -v --verbose -q --quiet --debug"; [[ $cur == -* ]] || { case $prev in farm) COMPREPLY=($(compgen -W "status" -- "$cur")) ;; sim) COMPREPLY=($(compgen -W "install-bin inventory" -- "$cur")) ;; *) COMPREPLY=($(compgen -W "run farm calibrate start stop status report metrics config container-args demo prolog task-prolog epilog install-hooks uninstall-hooks sim version completion help" -- "$cur")) ;; esac; return; } ;;
        'sim install-bin') words="-h --help --faults"; [[ $cur == -* ]] || { COMPREPLY=($(compgen -d -- "$cur")); return; } ;;
        'sim inventory') words="-h --help --gpus"; [[ $cur == -* ]] || { COMPREPLY=($(compgen -f -- "$cur")); return; } ;;
        *) COMPREPLY=($(compgen -f -- "$cur")); return ;;  # a launcher's, a program's
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _mpswrap mpswrap
