# bash completion for mpswrap, generated from its parser: mpswrap completion bash
_mpswrap() {
    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
    local cmd="" i=1 words=""
    # the command word: the first word after mpswrap's own options (and their values)
    while [ "$i" -lt "$COMP_CWORD" ]; do
        case ${COMP_WORDS[i]} in
            --) cmd=--; break ;;
            --gpus|--policy|--threads|--mem-limit|--priority|--verify-attach|--verify-timeout|--grace|--job|--gpus-per-rank) i=$((i + 2)); continue ;;
            -*) ;;
            *) cmd=${COMP_WORDS[i]}; break ;;
        esac
        i=$((i + 1))
    done
    # after a -- (run, calibrate) the words are the program's
    while [ $((i += 1)) -lt "$COMP_CWORD" ]; do
        [ "${COMP_WORDS[i]}" = -- ] && cmd=--
    done
    case "$cmd $prev" in
        ' --policy'|'run --policy'|'farm --policy'|'calibrate --policy') COMPREPLY=($(compgen -W "block cyclic affinity" -- "$cur")); return ;;
        ' --priority'|'start --priority'|'run --priority'|'farm --priority'|'calibrate --priority') COMPREPLY=($(compgen -W "0 1" -- "$cur")); return ;;
        ' --verify-attach'|'run --verify-attach'|'farm --verify-attach'|'calibrate --verify-attach') COMPREPLY=($(compgen -W "warn fail off" -- "$cur")); return ;;
        'start --config'|'stop --config'|'status --config'|'config --config'|'demo --config'|'farm --plot'|'calibrate --plot'|'report --config'|'metrics --config'|'container-args --config'|'prolog --config'|'task-prolog --config'|'epilog --config'|'install-hooks --python'|'install-hooks --config') COMPREPLY=($(compgen -f -- "$cur")); return ;;
        'start --run-dir'|'stop --run-dir'|'status --run-dir'|'farm --dir'|'calibrate --dir'|'metrics --run-dir'|'metrics --textfile'|'install-hooks --dest'|'install-hooks --modulefile'|'uninstall-hooks --dest'|'uninstall-hooks --modulefile') COMPREPLY=($(compgen -d -- "$cur")); return ;;
        'demo --simulate') COMPREPLY=($(compgen -W "auto yes no" -- "$cur")); return ;;
        'farm --progress') COMPREPLY=($(compgen -W "auto bar lines off" -- "$cur")); return ;;
    esac
    case $cmd in
        "") if [[ $cur == -* ]]; then words="-h --help --version --gpus --policy --threads --mem-limit --priority --verify-attach --verify-timeout --no-shield --grace --dry-run --job --gpus-per-rank -v --verbose -q --quiet --debug"; else words="start stop status config demo run farm calibrate report metrics container-args prolog task-prolog epilog version install-hooks uninstall-hooks sim completion help srun mpirun mpiexec orterun prun prterun torchrun"; fi ;;
        start) words="-h --help -v --verbose -q --quiet --debug --config --job --node --run-dir --gpus --user --cpus --threads --mem-limit --priority --prestart --json" ;;
        stop) words="-h --help -v --verbose -q --quiet --debug --config --job --node --run-dir --json" ;;
        status) words="-h --help -v --verbose -q --quiet --debug --config --job --node --run-dir --json --watch --all" ;;
        config) words="-h --help -v --verbose -q --quiet --debug --config --json" ;;
        demo) words="-h --help -v --verbose -q --quiet --debug --config --clients --simulate" ;;
        run) words="-h --help --gpus --policy --threads --mem-limit --priority --verify-attach --verify-timeout --no-shield --grace --dry-run --job --gpus-per-rank -v --verbose -q --quiet --debug -n --np" ;;
        farm) words="-h --help --gpus --policy --threads --mem-limit --priority --verify-attach --verify-timeout --no-shield --grace --dry-run --job --gpus-per-rank -v --verbose -q --quiet --debug --per-gpu --retries --dir --share --progress --tag --json --plot"; [[ $cur == -* ]] || { COMPREPLY=($(compgen -f -- "$cur")); return; } ;;
        calibrate) words="-h --help --gpus --policy --threads --mem-limit --priority --verify-attach --verify-timeout --no-shield --grace --dry-run --job --gpus-per-rank -v --verbose -q --quiet --debug --max --counts --repeats --plot --json --dir" ;;
        report) words="-h --help -v --verbose -q --quiet --debug --config --json" ;;
        metrics) words="-h --help -v --verbose -q --quiet --debug --config --job --node --run-dir --all --textfile --process-labels" ;;
        container-args) words="-h --help -v --verbose -q --quiet --debug --config --job"; [[ $cur == -* ]] || { COMPREPLY=($(compgen -W "podman docker apptainer singularity enroot bwrap" -- "$cur")); return; } ;;
        prolog) words="-h --help -v --verbose -q --quiet --debug --config" ;;
        task-prolog) words="-h --help -v --verbose -q --quiet --debug --config" ;;
        epilog) words="-h --help -v --verbose -q --quiet --debug --config" ;;
        version) words="-h --help -v --verbose -q --quiet --debug" ;;
        install-hooks) words="-h --help --python --config --dest --spank --modulefile -v --verbose -q --quiet --debug" ;;
        uninstall-hooks) words="-h --help --dest --modulefile --force -v --verbose -q --quiet --debug" ;;
        sim) words="-h --help"; [[ $cur == -* ]] || { COMPREPLY=($(compgen -W "install-bin inventory" -- "$cur")); return; } ;;
        completion) words="-h --help"; [[ $cur == -* ]] || { COMPREPLY=($(compgen -W "bash" -- "$cur")); return; } ;;
        help) words="-h --help --man-path"; [[ $cur == -* ]] || { COMPREPLY=($(compgen -W "start stop status config demo run farm calibrate report metrics container-args prolog task-prolog epilog version install-hooks uninstall-hooks sim completion help srun mpirun mpiexec orterun prun prterun torchrun" -- "$cur")); return; } ;;
        *) COMPREPLY=($(compgen -f -- "$cur")); return ;;  # a launcher's, a program's
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}
complete -o default -F _mpswrap mpswrap
